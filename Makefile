# The README's entry points. Run as root: the local provider makes containers and bridges.
SHELL := /bin/bash
VENV ?= .venv
# What needs root (apt, the containers and bridges, the tests that make them) runs through
# sudo for a user with sudo, and directly as root, where Debian may have no sudo at all.
# The venv stays the user's own.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PY := $(VENV)/bin/python
NODES ?= 3
# Debian packages the local provider, the benchmarks and the tests call (Chromium: the
# notebook test drives the system browser; nothing is downloaded by Selenium; MariaDB and
# RabbitMQ: the test cloud's database and broker, started by the tests on 127.0.0.1; qemu-utils:
# its Cinder inspects an image with qemu-img when it makes a volume from one).
APT_PACKAGES := lxc debootstrap nftables iproute2 openssh-client openmpi-bin libopenmpi-dev iperf3 cloud-init \
                prometheus prometheus-pushgateway prometheus-node-exporter pciutils python3-venv \
                openssh-server chromium chromium-driver mariadb-server rabbitmq-server qemu-utils

# The emulated VMs' tools (tests/vm): QEMU's system emulator without its GUI recommends.
VM_PACKAGES := qemu-system-x86 qemu-utils genisoimage

.PHONY: system-deps deps demo test fast unit integration cloud-tests cloud-then-vms cloud cloud-stop vm-deps vm-tests lint typecheck clean-demo provider

# The Debian packages first: the venv needs python3-venv, which a fresh Debian lacks.
system-deps:
	@# cloud-init is here for its schema validator (the tests check the user-data with it).
	@# On a machine that did not have it, it is switched off: it must never run at this host's boot.
	@dpkg -s cloud-init >/dev/null 2>&1 || { $(SUDO) mkdir -p /etc/cloud && $(SUDO) touch /etc/cloud/cloud-init.disabled; }
	@# Debian's prometheus, MariaDB and RabbitMQ packages start their services on install; the
	@# tests run their own: switched off once, right after the install (not on every make).
	@dpkg -s $(APT_PACKAGES) >/dev/null 2>&1 \
	  || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null \
	       && { $(SUDO) systemctl disable --now prometheus prometheus-node-exporter prometheus-pushgateway mariadb rabbitmq-server \
	            >/dev/null 2>&1 || true; }; }

# The deployer and its pinned tools (ruff, mypy, ansible-lint, pytest): all `make lint` needs.
$(VENV)/.tools: pyproject.toml
	@dpkg -s python3-venv >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv >/dev/null; }
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed: $(VENV)/.tools | system-deps
	@# torch is PyPI's build (with its CUDA wheels, ~2.6 GB; it runs on CPUs), downloaded once per
	@# machine into the wheelhouse that local nodes install from (deployer/providers/local/runtime_env.py);
	@# the tests run the benchmarks with it here too.
	$(SUDO) $(PY) -m deployer.providers.local.runtime_env fetch
	$(PY) -m pip install --quiet --find-links "$$($(PY) -m deployer.providers.local.runtime_env wheelhouse)" \
	  -r <($(PY) -m deployer.providers.local.runtime_env requirements)
	touch $@

deps: system-deps $(VENV)/.installed

demo: deps
	$(SUDO) $(VENV)/bin/deployer up --nodes $(NODES)
	$(SUDO) $(VENV)/bin/deployer status

# tests/cloud starts its own OpenStack (tests/cloud/testcloud.py) for the run, or uses the
# one `make cloud` left running, and applies terraform/openstack to it with the provider
# `make provider` builds (once per machine). After the unit tier, the test cloud's tier and
# the local cluster's run side by side, each its own pytest (they share no name, port or
# network; both mostly wait on their services): on two cores that saves a quarter of an
# hour over one after the other. Each one's output comes whole when it ends (-O).
# With VMS=1 (.ci/run) the emulated VMs' tier follows the cloud's, still beside the local
# cluster's, which is the longest: about 6 minutes less than after it.
TIER_TMP ?=
VMS ?=
test: deps provider
	$(SUDO) $(PY) -m pytest tests/unit
	$(MAKE) --no-print-directory -j2 -O $(if $(VMS),cloud-then-vms,cloud-tests) integration TIER_TMP=/tmp/deployer-tier

cloud-then-vms: deps provider
	$(MAKE) --no-print-directory cloud-tests
	$(MAKE) --no-print-directory vm-tests

# No root, no cluster, only real parts that take seconds: ~80 s here (tests/conftest.py; README, "Tests").
fast: deps
	$(PY) -m pytest -m "not integration and not slow and not cloud and not vm" tests

unit: deps
	$(PY) -m pytest tests/unit

# With TIER_TMP (make test), each tier's pytest has its own temporary root.
integration: deps
	$(SUDO) $(PY) -m pytest tests/integration $(if $(TIER_TMP),--basetemp=$(TIER_TMP)-integration)

cloud-tests: deps provider
	$(SUDO) $(PY) -m pytest tests/cloud $(if $(TIER_TMP),--basetemp=$(TIER_TMP)-cloud)

# The roles that need a kernel of their own (NFS on a volume found by serial, the driver's
# reboots) on two QEMU-emulated VMs booted as Nova boots servers; its own target so that
# `make test` stays under 45 min; .ci/run runs both.
vm-deps: deps
	@dpkg -s $(VM_PACKAGES) >/dev/null 2>&1 \
	  || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(VM_PACKAGES) >/dev/null; }

vm-tests: vm-deps
	$(SUDO) $(PY) -m pytest tests/vm

# A test cloud to use by hand (clouds.yaml path printed; OS_CLIENT_CONFIG_FILE=<it>
# OS_CLOUD=testcloud openstack ...); the tests reuse it while it runs.
cloud: deps provider
	$(SUDO) $(PY) -m tests.cloud.testcloud start

cloud-stop: deps
	$(SUDO) $(PY) -m tests.cloud.testcloud stop

# The checks .ci/run makes before the tests, and .pre-commit-config.yaml before a commit:
# ansible-lint's production profile (ansible/.ansible-lint) on site.yml and every role.
# Only the venv's tools are needed (about 40 s in a fresh clone). mypy holds benchmarks/ to
# torch's own types where torch is installed (`make deps`; .ci/run installs it first). Without
# torch its names read as Any, and strict mode's rules about Any (a class made from torch's
# Module, a value returned from a torch call) and the ignores torch's types need say nothing
# true: those four codes are left out for benchmarks/ and the scripts that import them, and
# the line says so.
MYPY_WITHOUT_TORCH := --disable-error-code misc --disable-error-code no-any-return \
                      --disable-error-code unused-ignore --disable-error-code untyped-decorator
lint: $(VENV)/.tools
	$(VENV)/bin/ruff check deployer tests benchmarks scripts ansible
	@$(MAKE) --no-print-directory typecheck
	cd ansible && ../$(VENV)/bin/ansible-lint --offline site.yml roles
	$(PY) scripts/terraform_fmt.py

typecheck: $(VENV)/.tools
	@if $(PY) -c 'import torch' 2>/dev/null; then echo "$(VENV)/bin/mypy"; $(VENV)/bin/mypy; else \
	  echo "lint: torch is not in $(VENV) (make deps): benchmarks/ and scripts/ are checked with torch's names as Any"; \
	  $(VENV)/bin/mypy deployer && $(VENV)/bin/mypy $(MYPY_WITHOUT_TORCH) benchmarks scripts; fi

clean-demo:
	-$(SUDO) $(VENV)/bin/deployer down --yes

# terraform-provider-openstack v3.4.0 built from the Go module proxy (pinned, checked against
# the checksum database and its go.sum) into a Terraform filesystem mirror, once per machine:
# /var/cache/deployer/terraform-plugins, or DEPLOYER_TF_PLUGIN_MIRROR=DIR. What a site without
# the Terraform registry names as terraform.plugin_mirror (docs/openstack.md). Needs Go >= 1.21.
provider:
	bash scripts/build_provider.sh
