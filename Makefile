# The two commands: `make demo` and `make test`. Each one does its own set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# Debian packages the test suite drives for real: strace (fsync before each acknowledgement),
# nftables and iproute2 (the harness network rules, loaded into namespaces), chromium (the
# panel's browser tests drive it through Playwright, headless; never Playwright's download),
# cryptsetup-bin (veritysetup: the Python dm-verity tree is checked against it), cpio (the
# initrd writer's archives are extracted by the real tool), qemu-system-x86 and ovmf (the
# reduced enclave image is booted under TCG with OVMF; its own packages come by apt-get download).
APT_PACKAGES := strace nftables iproute2 chromium cryptsetup-bin cpio qemu-system-x86 ovmf

.PHONY: demo test lint typecheck unit bench fuzz system-deps clean image

# The test and demo environment: the base package plus the engine and dev extras, with the
# CPU build of torch pinned by constraints.txt (anything newer pulls a multi-GB CUDA build).
$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[engine,dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/affidavit demo

test: $(BIN)/.installed system-deps lint typecheck unit

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy

unit: $(BIN)/.installed
	$(BIN)/pytest -p no:cacheprovider

# Installs what the tests drive for real, once, when it is missing (root on CI and here).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# The reduced enclave image into .affidavit/image/ (Debian packages and wheels cached in
# .affidavit/image-cache), then one boot under QEMU (TCG, OVMF) to its health line.
IMAGE_OUT ?= .affidavit/image
image: $(BIN)/.installed system-deps
	$(BIN)/affidavit image build --profile reduced --out $(IMAGE_OUT) --boot

bench: $(BIN)/.installed
	$(BIN)/python bench/log_append.py
	$(BIN)/python bench/determinism_cost.py
	$(BIN)/python bench/replay.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
