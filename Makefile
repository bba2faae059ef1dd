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

.PHONY: help deps kernels-deps sanity-deps sanity lab lab-destroy site test lint unit kernels image integration integration-serve integration-labs integration-tp3 tp3 integration-fleet fleet molecule host build clean

help:
	@echo "make lab          create the local lab ($(NODES) nodes; NODES=3 for more) and run site.yml on it"
	@echo "make test         everything CI runs: host, lint, sanity (with the unit tests), kernels, image, integration"
	@echo "                  (with molecule's site scenario on its lab), timed per stage"
	@echo "make unit         the unit tests alone, with pytest"
	@echo "make tp3          TP3 for real: a 3-node lab serves a model whose dimensions do not divide by 3, padded,"
	@echo "                  and gives the tokens of the unpadded model at TP1 (not part of make test)"
	@echo "make fleet        two serving groups (two 2-node labs) behind one vllm-router: throughput, a head killed"
	@echo "                  under load, a fleet upgrade under load with no request lost (not part of make test)"
	@echo "make molecule     molecule's site scenario on a lab of its own (create, check, converge, the lab playbook"
	@echo "                  again, idempotence, verify, destroy)"
	@echo "make sanity       the Ansible ecosystem's checks: ansible-test sanity and units, galaxy-importer on the"
	@echo "                  artifact, ansible-doc for every plugin and role (offline once installed)"
	@echo "make kernels      the NVFP4 Triton kernels under the interpreter, against their PyTorch reference"
	@echo "make image        the vLLM 0.33.0 seams against its own files; the image built and shipped between engines"
	@echo "make site         run site.yml against the current inventory (inventory/lab by default)"
	@echo "make lab-destroy  remove the local lab"
	@echo "make build        build the collection artifact into build/"
	@echo "make host         opt-in: node_memory applied for real to THIS machine, then restored"
	@echo "                  (SPARKFLEET_HOST_SCENARIO=1; CI sets it, its machines are disposable)"

# $(call venv_install,VENV,REQUIREMENTS): the venv with that pinned set, then the stamp ($@) that names the set.
# The machine's pip configuration may name local index folders that lack a package; pip warns for each.
define venv_install
	test -x $(1)/bin/python || python3 -m venv $(1)
	set -o pipefail; $(1)/bin/pip install --quiet --disable-pip-version-check -r $(2) 2>&1 \
	  | { grep -v "^WARNING: Location 'file:" || true; }
	rm -f $(1)/.installed-*
	touch $@
endef

deps: $(STAMP)

$(STAMP): requirements.txt scripts/bootstrap-controller
	scripts/bootstrap-controller
	$(call venv_install,$(VENV),requirements.txt)

# The NVFP4 kernels' tests need torch and Triton (2 GB); they get a venv of their own so `make lab` stays light.
# It is keyed by the pinned set's content and kept outside the checkout, so every clone on a machine shares it.
KREQ_HASH := $(shell sha256sum requirements-kernels.txt | cut -c1-12)
KVENV ?= $(HOME)/.cache/sparkfleet/venvs/kernels-$(KREQ_HASH)
KSTAMP := $(KVENV)/.installed-$(KREQ_HASH)

kernels-deps: $(KSTAMP)

$(KSTAMP): requirements-kernels.txt
	$(call venv_install,$(KVENV),requirements-kernels.txt)

# The Ansible ecosystem's own checks, offline once installed (scripts/sanity says what runs); galaxy-importer in a
# venv of its own (it pins its ansible-lint; keyed and kept like the kernels' one), shellcheck and ansible-test's pip
# bootstrap by scripts/bootstrap-sanity. ansible-test units collects and runs tests/unit.
IREQ_HASH := $(shell sha256sum requirements-importer.txt | cut -c1-12)
IVENV ?= $(HOME)/.cache/sparkfleet/venvs/importer-$(IREQ_HASH)
ISTAMP := $(IVENV)/.installed-$(IREQ_HASH)

sanity-deps: deps $(ISTAMP)
	scripts/bootstrap-sanity

$(ISTAMP): requirements-importer.txt
	$(call venv_install,$(IVENV),requirements-importer.txt)

sanity: sanity-deps
	IMPORTER_VENV=$(IVENV) scripts/sanity

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

# The unit tests run inside `sanity`, under ansible-test units (the same tests/unit `make unit` runs with pytest).
# The host scenario first, beside lint, while no lab runs (its zram and vm.* settings are this machine's, restored
# after it, and the labs' nodes read the same kernel). Then the serving lab's chain, the longest, on one lane;
# on the other the checks without a lab, then the other labs' tests (the same two lanes `make integration` runs
# on two pytest-xdist workers, with the checks in the second lane's otherwise idle start). (Measured: the serving
# lab's chain stays the longer lane even after the files module cut its converges, so the kernels stay beside it.)
# (the kernels on one worker there: the serving lab's drills beside them keep their deadlines)
test:
	@KERNEL_WORKERS=1 scripts/run-stages deps "host | lint" "integration-serve | sanity kernels image integration-labs"

lint: deps
	ansible-lint
	yamllint --strict .
	ruff check .
	pytest -p no:cacheprovider tests/monitoring

unit: deps
	pytest tests/unit

# The seams against vLLM 0.33.0's own files (its wheel, by version); the image's Dockerfile built FROM a stand-in
# base (the local Debian image plus those files); the vllm_image role between this engine and a second one.
image: deps
	pytest tests/image --durations=10

# Triton kernels on CPU tensors under the interpreter, against the PyTorch reference (GPU: files/sparkfleet_nvfp4/bench.py).
KERNEL_WORKERS ?= auto
kernels: kernels-deps
	TRITON_INTERPRET=1 $(KVENV)/bin/python -m pytest -p no:cacheprovider -n $(KERNEL_WORKERS) --maxprocesses=4 tests/kernels --durations=5

# One session: the labs are shared between the tests (see tests/integration/conftest.py), and molecule's site
# scenario runs there on the 2-node lab instead of on a lab of its own. The tests of each lab run one after the
# other on one pytest-xdist worker; the labs' groups (and the tests without a lab) run side by side, handed out in
# conftest's order (the serving lab's chain, the longest, first), not by their number of tests.
INTEGRATION_WORKERS ?= 2
integration: deps
	scripts/bootstrap-browser
	pytest tests/integration $(APART_TESTS:%=--ignore=%) -n $(INTEGRATION_WORKERS) --dist loadscope \
	  --no-loadscope-reorder --durations=25

# The two halves of `integration`, each a pytest session of its own: the serving lab's chain (molecule's site
# scenario, the serving tests and drills), and every other test (the other labs' groups, one after the other).
integration-serve: deps
	scripts/bootstrap-browser
	pytest tests/integration/test_serve.py --durations=25

integration-labs: deps
	pytest tests/integration --ignore=tests/integration/test_serve.py $(APART_TESTS:%=--ignore=%) --durations=25

# TP3 for real (docs/tp-padding.md): a model whose dimensions do not divide by 3, padded by the roles, gives the
# tokens of the unpadded model at TP1 - three vLLM boots on this machine (TP1, padded TP3, TP2), then a 3-node lab
# served by site.yml. Minutes of CPU beside the serving lab's drills, and a 3-node converge: not in `make test`
# (40 minutes); timed here by stage as `make test` is.
TP3_TESTS := tests/integration/test_tp_padding.py tests/integration/test_tp3.py
tp3: deps
	@scripts/run-stages deps integration-tp3

integration-tp3: deps
	pytest $(TP3_TESTS) --durations=10

# Two serving groups behind one vllm-router (docs/fleet.md): two 2-node labs converged by site.yml side by side, the
# router on the first group's head, then the fleet's throughput against one group's, a head killed under load and
# a fleet upgrade under load. Four vLLM ranks on this machine: not in `make test`; timed by stage as it is.
FLEET_TESTS := tests/integration/test_fleet.py
fleet: deps
	@scripts/run-stages deps integration-fleet

integration-fleet: deps
	pytest $(FLEET_TESTS) --durations=10

# The tests make test leaves to their own targets.
APART_TESTS := $(TP3_TESTS) $(FLEET_TESTS)

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
