# Thin wrapper over CMake (CMakeLists.txt is the one real build).
#   make          build everything into build/
#   make test     build, then run every test (GPU tests skip without a GPU)
#   make demo     the main job on the embedded example model
#   make asan     build and run the CPU tests under AddressSanitizer + UBSan (build-asan/)
#   make fuzz     libFuzzer on each fuzz target (tests/fuzz) for FUZZ_SECONDS (build-fuzz/);
#                 FUZZ_TARGETS picks some
#   make bench    benchmarks that print figures (not tests)
#   make aarch64  cross-build the host code for aarch64 (the Spark's Grace CPU) into
#                 build-aarch64/ and run its CPU tests under qemu-user
#   make format   clang-format every source file; format-check only reports
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= header request schema regex chat_output tokenizer config validate model_load

.PHONY: all build test demo asan fuzz bench aarch64 format format-check clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	bash tools/demo.sh $(BUILD)/bin/qforge $(BUILD)/demo recipes

asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DQF_SANITIZE=address,undefined \
	  -DQF_CUDA=OFF -DQF_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -L cpu

fuzz:
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DQF_FUZZ=ON -DQF_CUDA=OFF -DQF_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  dict=; [ ! -f tests/fuzz/$$t.dict ] || dict=-dict=tests/fuzz/$$t.dict; \
	  echo "== fuzz_$$t ($(FUZZ_SECONDS) s)"; \
	  len=4096; [ ! -f tests/fuzz/$$t.max_len ] || len=$$(cat tests/fuzz/$$t.max_len); \
	  build-fuzz/tests/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=$$len -timeout=20 \
	    -print_final_stats=1 $$dict build-fuzz/corpus/$$t tests/fuzz/seeds/$$t; \
	done

bench: build
	$(BUILD)/bin/qforge-bench-quant
	$(BUILD)/bin/qforge-bench-ckpt $(BENCH_ARGS)

# CUDA off: this toolkit has no aarch64 (sbsa) target. The demo's test is left out: it evaluates
# four models on 4,096 tokens, past 15 minutes under emulation; its steps are tested one by one.
# cross_arch_test compares with this machine's qforge: both must write the same bytes.
aarch64: build
	cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
	  -DCMAKE_BUILD_TYPE=Release -DQF_CUDA=OFF -DQF_HOST_QFORGE=$(abspath $(BUILD))/bin/qforge \
	  $(CMAKE_FLAGS)
	cmake --build build-aarch64 -j $(JOBS)
	cd build-aarch64 && ctest --output-on-failure -j $(JOBS) -L cpu \
	  -E '^ExampleModel.DemoRunsAndTheQuantizedCheckpointsKeepQuality$$'

format:
	git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i

format-check:
	git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format --dry-run -Werror

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-aarch64
