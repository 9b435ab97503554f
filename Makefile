# Two entry points: `make demo` and `make test`. Both set up what they need, idempotently.
VENV     := .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
CRIU     := .criu/bin/criu
INIT     := build/native/llfabric-init

.PHONY: demo test test-load test-fast test-corpus-full test-deep lint typecheck criu native sysdeps clean \
	device-bundle labextension docs wheel

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]' -r requirements-dev.txt
	touch $@

$(CRIU): scripts/provision-criu.sh $(STAMP)
	bash scripts/provision-criu.sh

criu: $(CRIU)

# The pid-1 init of template workers (native/); make rebuilds it only when its source changed.
$(INIT): native/init.c native/Makefile
	$(MAKE) -C native

native: $(INIT)

# The JupyterLab extension (labextension/): Node only here, at build time. Its prebuilt output
# (labextension/dist) goes into the venv's share/jupyter/labextensions, where JupyterLab finds it;
# a wheel carries it there through pyproject's data-files.
LABEXT   := labextension/dist/package.json
LABSHARE := $(VENV)/share/jupyter/labextensions/llfabric-lab
$(LABEXT): labextension/package.json labextension/package-lock.json labextension/tsconfig.json \
		$(wildcard labextension/src/*.ts) $(wildcard labextension/schema/*.json) $(STAMP)
	cd labextension && npm ci --no-audit --no-fund && npx tsc && node_modules/.bin/build-labextension \
		--core-path "$$(../$(PY) -c 'import jupyterlab, os; print(os.path.dirname(jupyterlab.__file__))')/staging" .
	mkdir -p $(dir $(LABSHARE)) && ln -sfn $(CURDIR)/labextension/dist $(LABSHARE)

labextension: $(LABEXT)

sysdeps:
	bash scripts/provision-sysdeps.sh

demo: $(STAMP)
	$(VENV)/bin/llfabric demo

# The documentation site, warnings as errors and every reference checked (tests/test_docs.py
# builds it the same way in `make test`).
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

# An sdist and, built from it, a wheel that installs without a checkout: the workers' init
# compiled in (setup.py), the prebuilt JupyterLab extension, the demo notebook.
wheel: $(STAMP) $(LABEXT)
	$(PY) -m build --no-isolation --outdir dist .

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# pyright as pyproject's [tool.pyright] sets it; any error fails the target.
typecheck: $(STAMP)
	$(VENV)/bin/pyright

test: $(STAMP) $(CRIU) $(INIT) $(LABEXT) sysdeps lint typecheck
	$(VENV)/bin/pytest -m "not gpu and not deep" -q

# The same suite beside a CPU hog on every core: what a loaded CI machine does to it.
test-load: $(STAMP) $(CRIU) $(INIT) $(LABEXT) sysdeps
	bash scripts/test-load.sh

# Every corpus differential on every notebook, the heavy ones included (about an hour here).
test-corpus-full: $(STAMP) $(CRIU) $(INIT) sysdeps
	LLFABRIC_CORPUS=full $(VENV)/bin/pytest -m slow -q

test-fast: $(STAMP) $(INIT)
	$(VENV)/bin/pytest -m "not gpu and not slow and not deep" -q

# Thousands of generated notebooks against a plain kernel (LLFABRIC_DEEP_EXAMPLES, default 3000),
# and the corpus differentials on every notebook of corpus/.
test-deep: $(STAMP) $(CRIU) $(INIT) sysdeps
	$(VENV)/bin/pytest -m deep -q

# What the GPU test machine lacks, in one folder to send with a call there (docs/user/gpus.md).
BUNDLE := build/device-bundle
$(BUNDLE)/MANIFEST: scripts/device-bundle.sh scripts/device-machine.txt pyproject.toml \
		$(shell find fabric cli -name '*.py') $(CRIU) $(INIT) $(LABEXT)
	bash scripts/device-bundle.sh $(BUNDLE)

device-bundle: $(BUNDLE)/MANIFEST
	@echo "device-bundle: $(BUNDLE) holds $$(du -sh $(BUNDLE) | cut -f1) (limit 64 MiB with the checkout)"

clean:
	rm -rf $(VENV) .criu build dist docs/_build labextension/node_modules labextension/lib labextension/dist
