# Distributed Deep Learning on HPC -- the two commands a user needs are `make lab` and `make test`.
SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
export DDLCOURSE_VENV := $(VENV)
# Notebooks and tests run at the smoke scale unless DDLCOURSE_SCALE says otherwise.
TEST_SCALE ?= $(or $(DDLCOURSE_SCALE),smoke)
# pytest-xdist workers for `make test`: WORKERS=N (env/run_tests.sh picks one more than the cores, at most 4);
# notebooks of one file stay on one worker (--dist loadfile).
NOTEBOOKS := $(wildcard notebooks/*.ipynb labs/*.ipynb)

.PHONY: help setup env lab test test-unit test-notebooks test-book rehearsal slides book lock clean-clusters clean

help:
	@echo "make lab     set up the environment if needed, then open JupyterLab on the course"
	@echo "make test    set up the environment if needed, then run every test (unit + nbval on all notebooks)"
	@echo "make rehearsal  every notebook and lab under nbval on two Slurm nodes built on this machine (root)"
	@echo "make setup   build or refresh the environment only (.venv; Horovod wheel cached in ~/.cache/ddlcourse)"
	@echo "make slides  build the instructor's reveal.js decks and PDF handouts (slides/decks, slides/pdf);"
	@echo "             SCALE=laptop: figures from laptop-scale runs, the reference results to publish"
	@echo "make book    the course as a static site in book/_build/html: every notebook and lab run at the laptop"
	@echo "             scale (cached with make slides' runs), the decks and PDFs, the exercises; SCALE=smoke for CI"
	@echo "make test-book  every page of the book in headless Chromium (the same SCALE as make book's)"
	@echo "make lock    re-resolve env/requirements.in into env/requirements.lock"
	@echo "make clean-clusters   stop every course cluster this user left running"

setup:
	@bash env/setup.sh

# Every target that needs the environment depends on this; it is a no-op when nothing changed.
env:
	@bash env/setup.sh

lab: env
	@TOKEN=$${JUPYTER_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_hex(24))')}; \
	PORT=$${JUPYTER_PORT:-8888}; \
	echo "JupyterLab on localhost only, token-protected. Open:  http://127.0.0.1:$$PORT/lab?token=$$TOKEN"; \
	echo "(from another machine: ssh -L $$PORT:127.0.0.1:$$PORT <this host>, then open the same URL). Ctrl-C stops it."; \
	exec $(VENV)/bin/jupyter lab --ip=127.0.0.1 --port=$$PORT --port-retries=0 --no-browser \
		--ServerApp.root_dir=$(CURDIR) --IdentityProvider.token=$$TOKEN $$([ "$$(id -u)" = 0 ] && echo --allow-root)

test: env
	@bash env/run_tests.sh all

test-unit: env
	@bash env/run_tests.sh unit

test-notebooks: env
	@bash env/run_tests.sh notebooks

# The class rehearsed on two nodes: two Slurm nodes in network namespaces (env/multinode/two_nodes.sh), one
# allocation of 2 x 2 tasks, every notebook and lab under nbval with its engines started by srun on both.
# Needs root and Debian's slurm-wlm + munge (installed if missing); .ci/run runs it after `make test`.
rehearsal: env
	@$(PY) env/multinode/rehearse.py

# reveal.js decks from the notebooks into slides/decks/, PDFs into slides/pdf/ (headless Chromium);
# SCALE=laptop runs the notebooks at the laptop scale for the figures (reference results to publish; at most about 15 min)
SCALE ?= smoke
slides: env
	@bash env/install_chromium.sh
	@$(PY) -m instructor.slides build --scale $(SCALE)

# The course as a book (instructor/book.py): every notebook and lab run at the laptop scale unless SCALE says
# otherwise (the runs `make slides SCALE=...` caches, so a warm cache runs nothing), the decks and their PDFs built
# from the same runs, then Sphinx. Open book/_build/html/index.html, or copy the folder to any static host.
book: SCALE = laptop
book: env
	@bash env/install_chromium.sh
	@$(PY) -m instructor.book build --scale $(SCALE)

# the browser test of the book (tests/test_book.py): the site built again from the runs `make book SCALE=...` cached,
# into book/_build/test, every page opened in headless Chromium
test-book: SCALE = laptop
test-book: env
	@bash env/install_chromium.sh
	@DDLCOURSE_SCALE=$(SCALE) $(PY) -m pytest -p no:cacheprovider -o addopts="" -q -rfE tests/test_book.py

lock:
	@bash env/lock.sh

clean-clusters:
	@$(PY) -m ddlcourse clusters stop-all

clean:
	rm -rf .test-runtime results .pytest_cache
