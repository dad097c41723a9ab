# Thin wrapper around meson/ninja. The README's two commands are `make run`
# and `make test`; both install missing Debian packages first.
BUILD ?= build

.PHONY: all deps build run test test-quick clean

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

clean:
	rm -rf build build-asan build-fuzz build*.log
