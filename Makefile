# Thin wrapper around meson/ninja. The README's two commands are `make run`
# and `make test`; both install missing Debian packages first. `make check`
# is the edit-test loop: the normal build and every suite but the slow ones
# (tests/README.md).
BUILD ?= build

.PHONY: all deps build run test test-quick check clean

all: build

deps:
	@deploy/install-deps.sh --check >/dev/null 2>&1 || deploy/install-deps.sh

build: deps
	@[ -f $(BUILD)/build.ninja ] || meson setup $(BUILD)
	ninja -C $(BUILD)

run: build
	deploy/run-local.sh $(BUILD)

test: deps
	tests/run-all.sh

test-quick: deps
	tests/run-all.sh --quick

check: deps
	@[ -f $(BUILD)/build.ninja ] || meson setup $(BUILD) -Dwerror=true
	meson test -C $(BUILD) --num-processes 2 --print-errorlogs \
	  --no-suite slow --no-suite package --no-suite bench-smoke --no-suite fuzz-long \
	  --no-suite ucx-known-bug

clean:
	rm -rf build build-asan build-fuzz build*.log build*.rc build-bg.*
