# Makefile - the two commands a new user types (make run, make test) and the
# sanitizer run.  Everything is CMake underneath; this only fixes the build
# directories and the parallelism.
BUILD     ?= build
SAN_BUILD ?= build-sanitize
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE     ?= cmake
CMAKE_ARGS ?=

.PHONY: all build run test sanitize clean

all: build

build:
	$(CMAKE) -S . -B $(BUILD) $(CMAKE_ARGS)
	$(CMAKE) --build $(BUILD) -j $(JOBS)

# One attention forward on the GPU when one is present, else on the CPU.  It
# builds only what it runs (libfattn.so and the fattn program); `make test`
# builds the rest (the static library, the tests, the example, the bench programs).
run:
	$(CMAKE) -S . -B $(BUILD) $(CMAKE_ARGS)
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target fattn_cli
	./$(BUILD)/tools/fattn run

# Every test; GPU tests report "skipped" on machines without a Hopper GPU.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer, CPU engine only.
sanitize:
	$(CMAKE) -S . -B $(SAN_BUILD) -DFATTN_SANITIZE=ON -DFATTN_ENABLE_CUDA=OFF \
	    -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)
	$(CMAKE) --build $(SAN_BUILD) -j $(JOBS)
	cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(SAN_BUILD)
