"""The `llfabric` command line: click commands that parse, call fabric, and print."""
