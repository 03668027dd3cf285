# The two set-up commands of the README:
#   make run    create .venv (Python 3.12 + the Megatron-Bridge stack) and run the main job
#   make test   the CPU test suite, in each environment (CI runs exactly this through .ci/run)
SHELL := /bin/bash
VENV ?= .venv
PY312 ?= $(shell p=$$(pyenv prefix 3.12.1 2>/dev/null) && [ -x "$$p/bin/python" ] && echo $$p/bin/python || command -v python3.12)
BIN := $(VENV)/bin

VENV2 ?= .venv-nemo2
# NeMo Framework 26.06's Megatron side from PyPI: the fw2606-pypi row of the tested matrix.
VENV3 ?= .venv-fw2606
# Every package of each environment at the version CI tested (upgrading = `make lock`, a reviewed change). The
# framework versions are stated once, in kaiyuan_recipes/doctor.py's TESTED_MATRIX: `make lock` takes its pins from
# there and tests/test_versions.py checks the locks and pyproject.toml's extras against it.
LOCK := constraints/bridge.txt
LOCK2 := constraints/nemo2.txt
LOCK3 := constraints/fw2606.txt
# A TESTED_MATRIX row's pins, for `make lock` (doctor.py imports nothing beyond the standard library at load).
pins = $(shell PYTHONPATH=. $(PY312) -c 'from kaiyuan_recipes.doctor import lock_pins; print(lock_pins("$(1)"))')

.PHONY: env env-nemo2 env-fw2606 run test test-services lint lock clean wheelhouse wheelhouse-install

env: $(VENV)/.installed

# NeMo 2 (`nemo llm pretrain --factory kaiyuan_qwen3`) needs megatron-core 0.15 and transformers 4.57:
# a second environment (the `nemo2` extra).
env-nemo2: $(VENV2)/.installed

$(VENV2)/.installed: pyproject.toml $(LOCK2)
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) -m venv $(VENV2)
	$(VENV2)/bin/pip install -q -c $(LOCK2) pip
	$(VENV2)/bin/pip install -q -c $(LOCK2) -e ".[$(EXTRAS2)]"
	# kaiyuan_recipes.compat.cpu_cuda_arch_list at interpreter start (see its docstring)
	echo "import kaiyuan_recipes.compat as c; c.cpu_cuda_arch_list()" > \
		"$$($(VENV2)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kaiyuan_compat.pth"
	touch $@

# megatron-bridge's declared dependencies include GPU-only builds (transformer-engine, mamba-ssm)
# that cannot build on a CPU host, so it is installed with --no-deps after the packages it
# imports (the `bridge` extra). nvidia-resiliency-ext is left out: it needs glibc >= 2.39.
# $(call bridge_env,venv,lock,extras)
define bridge_env
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) -m venv $(1)
	$(1)/bin/pip install -q -c $(2) pip
	$(1)/bin/pip install -q -c $(2) -e ".[$(3)]"
	$(1)/bin/pip install -q -c $(2) --no-deps megatron-bridge
	touch $(1)/.installed
endef

EXTRAS := bridge,run,serve,clean,loggers,dev
EXTRAS2 := nemo2
EXTRAS3 := bridge,serve,dev
$(VENV)/.installed: pyproject.toml $(LOCK)
	$(call bridge_env,$(VENV),$(LOCK),$(EXTRAS))

env-fw2606: $(VENV3)/.installed

$(VENV3)/.installed: pyproject.toml $(LOCK3)
	$(call bridge_env,$(VENV3),$(LOCK3),$(EXTRAS3))

# A deliberate upgrade: resolve both environments afresh from pyproject.toml (no constraints) in scratch venvs
# and write what they installed to the lock files; review the diff, run `make test`, commit.
# The Bridge stacks: the `bridge` extra's ranges with the row's pins, then megatron-bridge (its pin) --no-deps.
lock:
	rm -rf .lock-venv .lock-venv2 .lock-venv3
	$(PY312) -m venv .lock-venv && .lock-venv/bin/pip install -q --upgrade pip
	p="$(call pins,bridge-pypi)"; .lock-venv/bin/pip install -q ".[$(EXTRAS)]" $${p% *} && \
	  .lock-venv/bin/pip install -q --no-deps $${p##* }
	$(PY312) -m venv .lock-venv3 && .lock-venv3/bin/pip install -q --upgrade pip
	p="$(call pins,fw2606-pypi)"; .lock-venv3/bin/pip install -q ".[$(EXTRAS3)]" $${p% *} && \
	  .lock-venv3/bin/pip install -q --no-deps $${p##* }
	$(PY312) -m venv .lock-venv2 && .lock-venv2/bin/pip install -q --upgrade pip && .lock-venv2/bin/pip install -q ".[$(EXTRAS2)]"
	for pair in ".lock-venv:$(LOCK)" ".lock-venv2:$(LOCK2)" ".lock-venv3:$(LOCK3)"; do v=$${pair%%:*}; f=$${pair#*:}; \
	  { sed -n '1,2p' $$f; echo "pip==$$($$v/bin/pip --version | awk '{print $$2}')"; \
	    $$v/bin/pip freeze --exclude-editable | grep -v '^kaiyuan'; } > $$f.new && mv $$f.new $$f; done
	rm -rf .lock-venv .lock-venv2 .lock-venv3

run: env
	@if nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/kaiyuan train gpt_smoke; \
	else \
		echo "no GPU on this host: resolving the gpt_smoke run without launching it"; \
		$(BIN)/kaiyuan train gpt_smoke --dry-run; \
	fi

# What the tests need beyond Python: OpenSSH's sshd for the multi-node tests, and Slurm (slurm-wlm 22.05 with
# slurmdbd, munge and MariaDB, which sacct needs) for tests/test_slurm.py; the tests start their own daemons on
# loopback. Installed with apt-get when this is root on Debian; otherwise a clear message and a failure.
SERVICE_PACKAGES := openssh-server:/usr/sbin/sshd slurm-wlm:/usr/sbin/slurmctld slurmdbd:/usr/sbin/slurmdbd \
	munge:/usr/sbin/munged mariadb-server:/usr/sbin/mariadbd
test-services:
	@missing=$$(for pair in $(SERVICE_PACKAGES); do [ -x "$${pair#*:}" ] || echo "$${pair%%:*}"; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing" $$missing "(the multi-node and Slurm tests start their own daemons on loopback)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	else echo "the tests need:" $$missing "(apt-get install them, or run make test as root on Debian)" >&2; exit 1; fi

# The Megatron-side tests that run again on the fw2606 stack: providers, config build for every recipe and knob,
# model construction, compat workarounds, torch_dist save/resume on gloo, export both ways, doctor, curricula,
# the serving engine.
FW2606_TESTS := tests/test_providers.py tests/test_model_shape.py tests/test_recipes.py tests/test_knobs.py \
	tests/test_compat.py tests/test_compat_adam_step.py tests/test_ckpt.py tests/test_keep_last_k.py \
	tests/test_export_hf.py tests/test_export_knobs.py tests/test_doctor.py tests/test_blend.py \
	tests/test_ordered_phase.py tests/test_phase_training.py tests/test_one_resolver.py tests/test_serve_batching.py \
	tests/test_serve_attention.py

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
# Test files in parallel, a file's tests in one worker (its module fixtures built once): TEST_WORKERS=1 runs them
# one by one. Each worker imports torch and Megatron (~2 GB), so the default is CI's two cores, not one per core.
TEST_WORKERS ?= 2
PYTEST := -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile
test: env env-nemo2 env-fw2606 test-services lint
	$(BIN)/python $(PYTEST) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc; \
	$(VENV3)/bin/python $(PYTEST) $(FW2606_TESTS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests ($(VENV3))"; exit 1; fi; exit $$rc

# ruff with the project's settings (pyproject.toml [tool.ruff]), then the package's layers and no import cycles
# (import-linter, pyproject.toml [tool.importlinter]); both pinned in the dev extra.
lint: env
	$(BIN)/ruff check kaiyuan_recipes tests benchmarks recipes lab
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) $(VENV2) $(VENV3) runs

# An offline install for an air-gapped cluster: every package of the lock, built into ./wheelhouse/ as wheels
# (sdists built here, so the cluster needs no build tools), and this project's own wheel. Run it on a host with
# network and the cluster's platform (Linux x86_64, Python 3.12); copy the repository with wheelhouse/ across and
# install there with `make wheelhouse-install` (no index is contacted). WHEELHOUSE_LOCK picks another lock
# (constraints/fw2606.txt with WHEELHOUSE_EXTRAS=$(EXTRAS3)).
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_LOCK ?= $(LOCK)
WHEELHOUSE_EXTRAS ?= bridge,run,serve
wheelhouse:
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) -m pip wheel -q --no-deps -w $(WHEELHOUSE) -r $(WHEELHOUSE_LOCK)
	$(PY312) -m pip wheel -q --no-deps -w $(WHEELHOUSE) .
	@echo "$(WHEELHOUSE): $$(ls $(WHEELHOUSE) | wc -l) wheels, $$(du -sh $(WHEELHOUSE) | cut -f1)"

# On the air-gapped host: .venv from ./wheelhouse/ only, the same steps as `make env` (megatron-bridge --no-deps).
wheelhouse-install:
	@test -d $(WHEELHOUSE) || { echo "no $(WHEELHOUSE)/: run make wheelhouse on a host with network first"; exit 1; }
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) -m venv $(VENV)
	$(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE) -c $(WHEELHOUSE_LOCK) pip
	$(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE) -c $(WHEELHOUSE_LOCK) "kaiyuan-recipes[$(WHEELHOUSE_EXTRAS)]"
	$(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE) -c $(WHEELHOUSE_LOCK) --no-deps megatron-bridge
	touch $(VENV)/.installed
