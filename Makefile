# sparkfleet: the two set-up commands are `make lab` and `make test`; both install what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
REQ_HASH := $(shell sha256sum requirements.txt | cut -c1-12)
STAMP := $(VENV)/.installed-$(REQ_HASH)
NODES ?= 2

export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR ?= false
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help deps lab lab-destroy site test lint unit integration molecule host build clean

help:
	@echo "make lab          create the local lab ($(NODES) nodes; NODES=3 for more) and run site.yml on it"
	@echo "make test         everything CI runs: lint, unit, integration, molecule (timed per stage)"
	@echo "make site         run site.yml against the current inventory (inventory/lab by default)"
	@echo "make lab-destroy  remove the local lab"
	@echo "make build        build the collection artifact into build/"
	@echo "make host         opt-in: node_memory applied for real to THIS machine, then restored"
	@echo "                  (SPARKFLEET_HOST_SCENARIO=1; CI sets it, its machines are disposable)"

deps: $(STAMP)

$(STAMP): requirements.txt scripts/bootstrap-controller
	scripts/bootstrap-controller
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	# The machine's pip configuration may name local index folders that lack a package; pip warns for each.
	set -o pipefail; $(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt 2>&1 \
	  | { grep -v "^WARNING: Location 'file:" || true; }
	rm -f $(VENV)/.installed-*
	touch $@

lab: deps
	ansible-playbook playbooks/lab.yml -e lab_nodes=$(NODES)
	ansible-playbook site.yml
	@echo
	@echo "make lab: the lab runs $(NODES) node(s); inventory/lab/hosts.yml reaches them over SSH."
	@echo "Re-run 'make site' (or ansible-playbook site.yml) to converge again; it reports changed=0."

site: deps
	ansible-playbook site.yml

lab-destroy: deps
	ansible-playbook playbooks/lab.yml -e lab_state=absent

test:
	@scripts/run-stages deps lint unit integration molecule host

lint: deps
	ansible-lint
	yamllint --strict .
	ruff check .

unit: deps
	pytest tests/unit

integration: deps
	pytest tests/integration --durations=25

molecule: deps
	molecule test -s site

# Kernel-global settings (zram, vm.*) are applied for real only here, and restored; opt-in.
host: deps
	@if [ "$${SPARKFLEET_HOST_SCENARIO:-}" = 1 ]; then molecule test -s host; else \
	  echo "host scenario not enabled: it applies zram, vm.* sysctls and the watchdog to this machine and then"; \
	  echo "restores them; set SPARKFLEET_HOST_SCENARIO=1 on a disposable machine (.ci/run does)"; fi

build: deps
	ansible-galaxy collection build --force --output-path build/

clean:
	rm -rf build .pytest_cache .ruff_cache
