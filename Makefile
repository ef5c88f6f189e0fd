# The README's two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make demo` installs only the embedded extra (no dev toolchain); an up-to-date dev install covers it.
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-stress lint format bench clean vendor-web docs docs-serve

demo: $(DEMO_STAMP)
	$(BIN)/stepq demo

# The suite runs in 4 pytest-xdist processes: most tests wait on subprocess workers and servers, so
# 4 processes on 2 cores halve the run; every test keeps its own key prefix and ports.
PYTEST_WORKERS ?= 4

test: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The suite with every core kept busy by a CPU burner, as on a loaded CI machine: a test that depends
# on timing fails here. The trap kills the burners however pytest ends (pass, failure, Ctrl-C).
test-stress: $(STAMP)
	@burners=""; \
	trap 'kill $$burners 2>/dev/null' EXIT; \
	trap 'exit 130' INT; trap 'exit 143' TERM; \
	for _ in $$(seq "$$(nproc 2>/dev/null || echo 2)"); do \
		$(PYTHON) -c "while True: pass" & burners="$$burners $$!"; \
	done; \
	echo "test-stress: $$(echo $$burners | wc -w) CPU burners running (pids$$burners)"; \
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# mypy cannot follow the editable install's package-dir mapping, so it reads a link tree laid out as
# the installed package: build/typecheck/stepq = shared/ + workers/ + producer/.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf build/typecheck && mkdir -p build/typecheck/stepq
	for f in shared/*; do ln -s "$$PWD/$$f" build/typecheck/stepq/; done
	ln -s "$$PWD/workers" "$$PWD/producer" build/typecheck/stepq/
	MYPYPATH=build/typecheck $(BIN)/mypy -p stepq
	MYPYPATH=build/typecheck:docs/_gen $(BIN)/mypy docs/_gen/hooks.py docs/_gen/stepq_docgen  # the site's generators

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The documentation site (mkdocs.yml): built strictly into site/ (a broken link or anchor, a page left out of
# the nav, a warning of any kind fails it, as tests/test_docs_site.py does under `make test`); the Reference
# pages are generated from the code at build time (docs/_gen). DOCS_ADDR: where docs-serve listens.
DOCS_ADDR ?= 127.0.0.1:8001

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

bench: $(STAMP)
	$(BIN)/python -m bench.step_overhead
	$(BIN)/python -m bench.fanout

# Reinstall only when pyproject.toml changed since the last install (the package itself is editable).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then :; \
	else $(BIN)/python -m pip install --quiet -e '.[embedded]'; fi
	touch $(DEMO_STAMP)

# The browser libraries the web pages ship (Markdown, sanitizing), pinned in web-vendor/package.json and
# copied with their licenses into producer/web/vendor/. The copies are committed, so `pip install stepq`
# users get them without npm and the pages load nothing from a CDN; run this after bumping a version.
VENDOR := producer/web/vendor
vendor-web:
	cd web-vendor && npm ci --no-audit --no-fund
	mkdir -p $(VENDOR)
	sed '/^\/\/# sourceMappingURL=/d' web-vendor/node_modules/marked/lib/marked.esm.js > $(VENDOR)/marked.esm.js
	sed '/^\/\/# sourceMappingURL=/d' web-vendor/node_modules/dompurify/dist/purify.es.mjs > $(VENDOR)/purify.es.mjs
	cp web-vendor/node_modules/marked/LICENSE.md $(VENDOR)/marked.LICENSE.txt 2>/dev/null || cp web-vendor/node_modules/marked/LICENSE $(VENDOR)/marked.LICENSE.txt
	cp web-vendor/node_modules/dompurify/LICENSE $(VENDOR)/purify.LICENSE.txt
	cd web-vendor && node -e 'const l=require("./package-lock.json").packages;console.log(["marked","dompurify"].map(n=>n+" "+l["node_modules/"+n].version).join("\n"))' > ../$(VENDOR)/VERSIONS.txt

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
