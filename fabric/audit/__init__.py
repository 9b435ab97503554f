"""The closure audit: run a notebook cell by cell and check that each cell's closure holds
everything the cell looked up, and, verified, that the cell leaves the same state on its
closure alone as on the whole session.

`recorder` runs the cells (a recording namespace, a forked closure-only run), `fingerprint`
digests values for comparing the two runs, `report` renders the result, and
``python -m fabric.audit`` (`__main__`) is the process `audit_notebook` starts.
"""

from .fingerprint import Fingerprint, fingerprints
from .recorder import Auditor, CellAudit, audit_notebook
from .report import report

__all__ = ["Auditor", "CellAudit", "Fingerprint", "audit_notebook", "fingerprints", "report"]
