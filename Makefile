# kvchat build. `make help` lists the targets.
# Plain GNU make: one object per source file, automatic header dependencies (-MMD), no generated code
# but the one-line header that names the commit the program is built from.

CC      ?= cc
CXX     ?= c++
# CUDA=1: the CUDA backend (kernels/cuda/*.cu through nvcc, cuBLAS) in a build directory of its own.
CUDA    ?=
ifeq ($(CUDA),1)
BUILD   ?= build-cuda
else
BUILD   ?= build
endif
# Where the C and C++ objects go: $(BUILD), except in cuda-build (run by make test and make test-gpu),
# which links the CPU build's objects from build/ and compiles only kernels/cuda/*.cu and the GPU
# tests into build-cuda/. The objects are the same in both builds: they differ in kernels/cuda/*.cu
# against kernels/cuda_absent.c and in the libraries linked, and no C source reads KVCHAT_CUDA
# (cuda-build refuses one that names it; only the GPU tests' objects get -DKVCHAT_CUDA). A plain
# `make CUDA=1` still compiles everything into build-cuda/.
OBJ     ?= $(BUILD)
OPT     ?= -O2
SAN     ?=
CWARN    = -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
# -ffp-contract=off: a * b + c is never fused behind the code's back (gcc's default for -std=c11, not
# clang's), so the portable kernels round exactly where their SIMD twins do under either compiler.
CFLAGS_ALL = -std=c11 $(OPT) -g $(CWARN) -ffp-contract=off -D_GNU_SOURCE -pthread -I. $(SAN) $(CFLAGS)
CXXFLAGS_ALL = -std=c++17 $(OPT) -g -Wall -Wextra -Werror -I. $(SAN) $(CXXFLAGS)
# SIMD kernels live in *_avx2.c, *_avxvnni.c and *_avx512.c files, the only ones compiled for those
# instruction sets; the choice between them and the portable kernels is made at run time from
# cpuid and xgetbv (kernels/cpu/vec_dot.c). Their functions and loops start on 64-byte boundaries:
# left to the default, prefill speed moved by 5-10% from one commit to the next with where
# unrelated code pushed the hot loops (bench/README.md).
SIMDALIGN    = -falign-functions=64 -falign-loops=64
AVX2FLAGS    = -mavx2 -mfma -mf16c $(SIMDALIGN)
AVXVNNIFLAGS = -mavx2 -mfma -mf16c -mavxvnni $(SIMDALIGN)
AVX512FLAGS  = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni $(SIMDALIGN)
LDLIBS_ALL = -lsentencepiece -lsqlite3 -lnettle -lncursesw -lstdc++ -lm -pthread $(SAN) $(LDLIBS)
# nvcc on PATH, else where NVIDIA's installer puts it (it leaves PATH alone); looked up once
ifeq ($(origin NVCC),undefined)
NVCC      := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; } || echo nvcc)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
# sm_80 (A100) and sm_90 (H100/H200) code, and PTX for newer devices
NVARCH    = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
            -gencode arch=compute_90,code=compute_90
# NVHOST: more flags for the host compiler behind nvcc (the sanitizers of cuda-asan-build)
NVHOST    =
NVFLAGS   = -std=c++17 $(OPT) -g -I. $(NVARCH) \
            -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-Werror$(NVHOST)
ifeq ($(CUDA),1)
# (the path as RUNPATH, which LD_LIBRARY_PATH overrides: how the stand-in runtime replaces the real one)
LDLIBS_ALL += -L$(CUDA_HOME)/lib64 -Wl,--enable-new-dtags,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart
endif

ENGINE_C  := $(wildcard common/*.c) $(wildcard engine/*.c) $(wildcard engine/policy/*.c) $(wildcard store/*.c)
ENGINE_CXX:= $(wildcard engine/*.cpp)
KERNEL_C  := $(wildcard kernels/cpu/*.c) kernels/page_copies.c kernels/page_tables.c kernels/summary_lists.c kernels/upload_batch.c kernels/act_mirror.c kernels/attn_rows.c kernels/block_pool.c kernels/weight_f16.c kernels/const_copies.c kernels/step_graphs.c kernels/gpu_weights.c kernels/op_profile.c kernels/backend.c
KERNEL_CU := $(wildcard kernels/cuda/*.cu)
ifneq ($(CUDA),1)
KERNEL_C  += kernels/cuda_absent.c
KERNEL_CU :=
endif
APP_C     := $(wildcard app/*.c) $(wildcard app/eval/*.c) $(wildcard ui/*.c)
# The tiny-model reference checker, run on the CPU by the unit tests and on the GPU by gpu_tests
REF_GATE_C:= tests/ref_gate.c
UNIT_C    := $(wildcard tests/test_*.c) $(REF_GATE_C) tests/sess_fixture.c tests/fwd_fixture.c
MODEL_T_C := $(wildcard tests/model/test_*.c)
GPU_T_C   := $(wildcard tests/gpu/test_*.c) $(REF_GATE_C) tests/fwd_fixture.c

LIB_OBJ  := $(ENGINE_C:%.c=$(OBJ)/%.o) $(ENGINE_CXX:%.cpp=$(OBJ)/%.o) $(KERNEL_C:%.c=$(OBJ)/%.o) \
            $(KERNEL_CU:%.cu=$(BUILD)/%.o)
APP_OBJ  := $(APP_C:%.c=$(OBJ)/%.o)
# The front ends' objects without main(), linked into the unit tests that test app/ and ui/ modules
FRONT_OBJ := $(filter-out $(OBJ)/app/main.o,$(APP_OBJ))
UNIT_OBJ := $(UNIT_C:%.c=$(OBJ)/%.o)
MODEL_T_OBJ := $(MODEL_T_C:%.c=$(OBJ)/%.o)
GPU_T_OBJ := $(GPU_T_C:%.c=$(BUILD)/%.o)

KVCHAT   := kvchat
LIB      := $(BUILD)/libkvchat.a
UNIT_BIN := $(BUILD)/tests/unit_tests
MODEL_BIN:= $(BUILD)/tests/model_tests
GPU_BIN  := $(BUILD)/tests/gpu_tests

# Where the default model lives (outside the repository) and how it is fetched.
XDG_CACHE_HOME ?= $(HOME)/.cache
KVCHAT_CACHE   ?= $(XDG_CACHE_HOME)/kvchat
# KVCHAT_MODEL (a model file of one's own, which kvchat runs by default) is the one the model tests
# use, and then nothing is fetched (scripts/fetch_model.sh).
ifneq ($(KVCHAT_MODEL),)
DEFAULT_MODEL  ?= $(KVCHAT_MODEL)
endif
DEFAULT_MODEL  ?= $(KVCHAT_CACHE)/models/gemma-3-270m-q4_k_m.gguf
export KVCHAT_CACHE DEFAULT_MODEL

.PHONY: all help run test unit-tests model-tests asan fuzz model bootstrap bench bench-host-cost test-standin cuda-asan-build bench-tables bench-pick bench-bounds bench-chess bench-mass bench-lsh bench-links clean cuda-build test-gpu \
        test-model-first test-model-rest test-cuda-build test-fuzz-smoke

all: $(KVCHAT)

help:
	@echo "make            build ./kvchat (CC=clang works too)"
	@echo "make run        install what is missing, fetch the default model, start kvchat (on the GPU where nvcc and one are present)"
	@echo "make test       install what is missing, fetch the default model, run every test"
	@echo "make unit-tests build and run the unit and tiny-model tests only (no default model)"
	@echo "make model-tests build and run the default-model tests only"
	@echo "make asan       build with AddressSanitizer+UBSan and run the unit tests"
	@echo "make CUDA=1     build ./kvchat with the CUDA backend (nvcc, cuBLAS; sm_80 and sm_90)"
	@echo "make test-gpu   build the CUDA backend and run its parity tests against the CPU (needs a GPU)"
	@echo "make fuzz       build the GGUF, snapshot and eval-CSV fuzzers (clang libFuzzer) and run each for FUZZ_SECONDS (60)"
	@echo "make model      fetch and verify the default model (Gemma 3 270M Q4_K_M) into $(KVCHAT_CACHE)"
	@echo "make bootstrap  install the Debian packages kvchat needs (apt-get when root)"
	@echo "make bench      kvchat bench on the default model, appended to bench/results.csv"
	@echo "make bench-host-cost  a decode step's host work on the CUDA backend, timed and counted without a GPU (bench/host_cost.sh)"
	@echo "make test-standin the CUDA build's host code under ASan and UBSan without a GPU, and its failures (scripts/standin_check.sh, standin_faults.sh; part of make test)"
	@echo "make bench-tables  the host's share of a CUDA attention call, timed without a GPU (bench/page_tables_bench.c)"
	@echo "make bench-pick    the host's share of choosing a token, with and without the backend's pick (bench/pick_bench.c)"
	@echo "make bench-chess   the host's share of CHESS's reconstruction a decode step, 7B shape (bench/chess_bench.c;"
	@echo "                   build/bench/chess_bench THREADS MAX_CTX POLICY for another selection, e.g. quest:budget=1024)"
	@echo "make bench-bounds  the host's share of Quest's page selection, before and after the bounds op (bench/bounds_bench.c)"
	@echo "make bench-mass    the eviction policies' attention mass a call at the 7B shape, 1 thread and all (bench/mass_bench.c)"
	@echo "make bench-lsh     LASER-KV's SimHash recall a call at the 7B shape: the plain loops, the op on 1 thread and all (bench/lsh_bench.c)"
	@echo "make bench-links   Chelsea's soft matching a pass: the search before the op, the op on 1 thread and all (bench/links_bench.c)"
	@echo "make clean      remove build outputs"

bootstrap:
	@scripts/bootstrap.sh

model: bootstrap
	@scripts/fetch_model.sh

# The kind of build a binary was linked as (cpu or cuda), rewritten only when it changes: a binary
# of the other kind is linked again (make CUDA=1 then make must not leave a CUDA ./kvchat, whose
# objects are older than the CPU build's).
BUILD_KIND := $(if $(filter 1,$(CUDA)),cuda,cpu)
$(KVCHAT).kind: FORCE
	@mkdir -p $(dir $@)
	@[ "$$(cat $@ 2>/dev/null)" = "$(BUILD_KIND)" ] || echo $(BUILD_KIND) > $@

$(KVCHAT): $(APP_OBJ) $(LIB) $(KVCHAT).kind
	$(CC) -o $@ $(APP_OBJ) $(LIB) $(LDLIBS_ALL)

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(OBJ)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX2FLAGS) -MMD -MP -c $< -o $@

$(OBJ)/%_avxvnni.o: %_avxvnni.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVXVNNIFLAGS) -MMD -MP -c $< -o $@

$(OBJ)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX512FLAGS) -MMD -MP -c $< -o $@

$(OBJ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(OBJ)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_ALL) -MMD -MP -c $< -o $@

# The commit the program is built from, which bench and eval write beside their figures (the
# checkout they run in may be at another): rewritten only when it changes, so a new commit
# recompiles app/cli.c alone. "+changes" when the sources differ from that commit or add files to
# it; "unknown" outside a git checkout of its own (a tarball, even one unpacked inside another).
COMMIT_H := $(OBJ)/app/build_commit.h
$(COMMIT_H): FORCE
	@mkdir -p $(dir $@)
	@c=unknown; src="app engine kernels common ui store Makefile"; \
	if [ "$$(git rev-parse --show-toplevel 2>/dev/null)" = "$(CURDIR)" ]; then \
		c=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown); \
		if [ "$$c" != unknown ] && { ! git diff --quiet HEAD -- $$src 2>/dev/null || \
			[ -n "$$(git ls-files --others --exclude-standard -- $$src 2>/dev/null)" ]; }; then c="$$c+changes"; fi; \
	fi; \
	t=$@.$$$$.tmp; printf '#define KVCHAT_BUILD_COMMIT "%s"\n' "$$c" > $$t; \
	if cmp -s $$t $@; then rm -f $$t; else mv $$t $@; fi
$(OBJ)/app/cli.o: $(COMMIT_H)
$(OBJ)/app/cli.o: CFLAGS_ALL += -I$(OBJ)
FORCE:
.PHONY: FORCE

# ptxas's register and spill report is kept beside each object (checked by scripts/check_ptxas.sh)
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Xptxas -v -MMD -MP -c $< -o $@ 2>$@.ptxas || { cat $@.ptxas; rm -f $@; exit 1; }
	@grep -v '^ptxas info\|^    [0-9]* bytes stack frame' $@.ptxas >&2 || true

# The GPU tests' objects stay in the CUDA build's own directory, compiled with -DKVCHAT_CUDA.
ifeq ($(CUDA),1)
$(GPU_T_OBJ): CFLAGS_ALL += -DKVCHAT_CUDA
endif
$(GPU_T_OBJ): $(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# tests/test_faults.c fails the Nth allocation of kvchat's own code through these wrappers (off
# unless a test arms them); sqlite's allocations and writes it fails through sqlite's own hooks
FAULT_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc
$(UNIT_BIN): $(UNIT_OBJ) $(FRONT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(UNIT_OBJ) $(FRONT_OBJ) $(LIB) $(FAULT_WRAP) -lcriterion $(LDLIBS_ALL)

$(GPU_BIN): $(GPU_T_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(GPU_T_OBJ) $(LIB) -lcriterion $(LDLIBS_ALL)

# The kernel micro-benchmark (scripts/gpu-check.sh runs it on a GPU): times through the op table and
# a copy through the CUDA runtime
GPU_BENCH := $(BUILD)/tests/gpu_bench
$(BUILD)/tests/gpu/bench_kernels.o: tests/gpu/bench_kernels.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -I$(CUDA_HOME)/include -MMD -MP -c $< -o $@

$(GPU_BENCH): $(BUILD)/tests/gpu/bench_kernels.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

# The stand-in CUDA runtime and cuBLAS (bench/standin/): libraries of the real ones' names and symbol
# versions that answer every call at once and run no kernel. A CUDA kvchat run with them first on
# LD_LIBRARY_PATH does all of its own host work without a GPU: make bench-host-cost times and counts
# it, and make test runs the CUDA backend's host code under ASan and UBSan with them
# (scripts/standin_check.sh). Never linked into a program.
CUDART_MAJOR := $(shell sed -n 's/^\#define CUDART_VERSION *\([0-9]*\).*/\1/p' $(CUDA_HOME)/include/cuda_runtime_api.h 2>/dev/null | awk '{ print int($$1 / 1000) }')
STANDIN      := build-cuda/standin
STANDIN_LIBS := $(STANDIN)/libcudart.so.$(CUDART_MAJOR) $(STANDIN)/libcublas.so.$(CUDART_MAJOR)
STANDIN_CC    = $(CC) -std=c11 -O2 -g $(CWARN) -D_GNU_SOURCE -fPIC -shared -I$(CUDA_HOME)/include
$(STANDIN)/libcudart.so.%: bench/standin/cudart.c
	@mkdir -p $(dir $@)
	printf 'libcudart.so.%s { global: cuda*; __cuda*; local: *; };\n' $* > $@.map
	$(STANDIN_CC) -Wl,-soname,libcudart.so.$* -Wl,--version-script=$@.map $< -o $@
$(STANDIN)/libcublas.so.%: bench/standin/cublas.c
	@mkdir -p $(dir $@)
	printf 'libcublas.so.%s { global: cublas*; local: *; };\n' $* > $@.map
	$(STANDIN_CC) -Wl,-soname,libcublas.so.$* -Wl,--version-script=$@.map $< -o $@

bench-host-cost: cuda-build $(STANDIN_LIBS) model
	bash bench/host_cost.sh build-cuda/kvchat $(STANDIN) $(DEFAULT_MODEL)

# The host's share of a CUDA attention call (page descriptors and row uploads), timed without a GPU
TABLES_BENCH := $(BUILD)/bench/page_tables_bench
$(TABLES_BENCH): $(OBJ)/bench/page_tables_bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

bench-tables: $(TABLES_BENCH)
	./$(TABLES_BENCH)

# The host's share of choosing a token, with and without the backend's pick
PICK_BENCH := $(BUILD)/bench/pick_bench
$(PICK_BENCH): $(OBJ)/bench/pick_bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

bench-pick: $(PICK_BENCH)
	./$(PICK_BENCH)

# The host's share of CHESS's reconstruction at each decode step (7B shape)
CHESS_BENCH := $(BUILD)/bench/chess_bench
$(CHESS_BENCH): $(OBJ)/bench/chess_bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

bench-chess: $(CHESS_BENCH)
	./$(CHESS_BENCH)

# The eviction policies' attention mass a call, 7B shape
MASS_BENCH := $(BUILD)/bench/mass_bench
$(MASS_BENCH): $(OBJ)/bench/mass_bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

bench-mass: $(MASS_BENCH)
	./$(MASS_BENCH)

# LASER-KV's SimHash recall a call, 7B shape
LSH_BENCH := $(BUILD)/bench/lsh_bench
$(LSH_BENCH): $(OBJ)/bench/lsh_bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

bench-lsh: $(LSH_BENCH)
	./$(LSH_BENCH)

# Chelsea's soft matching a pass, the default model's and the 7B shape's head dimensions
LINKS_BENCH := $(BUILD)/bench/links_bench
$(LINKS_BENCH): $(OBJ)/bench/links_bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

bench-links: $(LINKS_BENCH)
	./$(LINKS_BENCH)

# The host's share of Quest's page selection, before and after the bounds op
BOUNDS_BENCH := $(BUILD)/bench/bounds_bench
$(BOUNDS_BENCH): $(OBJ)/bench/bounds_bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(LIB) $(LDLIBS_ALL)

bench-bounds: $(BOUNDS_BENCH)
	./$(BOUNDS_BENCH)

$(MODEL_BIN): $(MODEL_T_OBJ) $(FRONT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(MODEL_T_OBJ) $(FRONT_OBJ) $(LIB) -lcriterion $(LDLIBS_ALL)

# make run: the GPU when there is one. With nvcc installed and an NVIDIA GPU present
# (scripts/run-device.sh), the CUDA build, build-cuda/kvchat (as make test builds it, on the CPU
# build's objects); a CUDA build that fails is said and the CPU build runs instead. Otherwise, and
# with CUDA=0 or CUDA=1 on the command line, ./kvchat built that way.
# Under make -n only the choice is printed: a line with $(MAKE) in it runs even then.
run: model
ifneq (,$(findstring n,$(firstword -$(MAKEFLAGS))))
	@echo "make run would run $(if $(CUDA),./$(KVCHAT),$(if $(filter cuda,$(shell bash scripts/run-device.sh '$(NVCC)' 2>/dev/null)),build-cuda/kvchat,./$(KVCHAT))) $(ARGS)"
else ifeq ($(CUDA),)
	@if [ "$$(bash scripts/run-device.sh '$(NVCC)')" = cuda ]; then \
	    if $(MAKE) --no-print-directory CUDA=1 BUILD=build-cuda OBJ=$(OBJ) KVCHAT=build-cuda/kvchat \
	        build-cuda/kvchat; then exec ./build-cuda/kvchat $(ARGS); fi; \
	    echo "make run: the CUDA build failed (above): the CPU build runs instead (make run CUDA=0 skips the CUDA build)" >&2; \
	fi; \
	$(MAKE) --no-print-directory $(KVCHAT) && exec ./$(KVCHAT) $(ARGS)
else
	@$(MAKE) --no-print-directory $(KVCHAT) && exec ./$(KVCHAT) $(ARGS)
endif

# make test builds with one job per core unless make was given -j.
JOBS      ?= $(shell nproc 2>/dev/null || echo 1)
TEST_JOBS  = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS))

# The unit tests (including the tiny-model reference gates) run first, then the tests that need
# the default model in two runners beside the CUDA build whenever nvcc is installed (MODEL_FIRST).
# Criterion prints a synthesis line for each runner.
test: model
	@$(MAKE) --no-print-directory $(TEST_JOBS) $(KVCHAT) $(UNIT_BIN) $(MODEL_BIN) $(TABLES_BENCH) $(PICK_BENCH) $(BOUNDS_BENCH)
	scripts/check_layers.sh
	./$(UNIT_BIN) -j2
	@$(MAKE) --no-print-directory $(TEST_JOBS) test-model-first test-model-rest test-cuda-build test-fuzz-smoke

# make test's last step: jobs that make runs side by side and that use the build above without
# redoing it. The model tests in two runners, each one test at a time: MODEL_FIRST (TAKE's eval,
# nearly as long as the nine others together) in one, from the start, and every other test in the
# other (criterion -j2 would start it eighth, in name order, and leave it running alone at the end);
# then the CUDA build, mostly one nvcc at a time, beside whichever is still running, and the fuzz
# harnesses built and run briefly (scripts/fuzz_smoke.sh), so a harness the code has moved away
# from fails here rather than at the next `make fuzz`. Each model test
# runs exactly once: the second runner takes every test that the first one's pattern does not match.
# Two at a time is safe: the tests share no file (mkstemp, mkdtemp, a tmux server per script),
# none measures speed, and the longest wait on the screen in tests/tui/basic.sh on the default
# model took 3 s of its 20 under a load of 5.
MODEL_FIRST := default_model/take_answers_generated_passkey_documents
test-model-first:
	KVCHAT_MODEL=$(DEFAULT_MODEL) ./$(MODEL_BIN) -j1 --filter '$(MODEL_FIRST)'

test-model-rest:
	KVCHAT_MODEL=$(DEFAULT_MODEL) ./$(MODEL_BIN) -j1 --filter '!($(MODEL_FIRST))'

# The default-model tests alone, the same two runners as make test.
model-tests: model $(MODEL_BIN)
	@$(MAKE) --no-print-directory $(TEST_JOBS) test-model-first test-model-rest

test-cuda-build:
	@if command -v $(NVCC) >/dev/null 2>&1; then $(MAKE) --no-print-directory cuda-build && \
	    $(MAKE) --no-print-directory test-standin; \
	 else echo "nvcc not found: the CUDA backend was not built (make CUDA=1 needs the CUDA toolkit)"; fi

# The CUDA backend's host code under ASan and UBSan without a GPU: a CUDA build with the sanitizers
# (its C objects those of make asan, its CUDA objects with code for one architecture only: the
# stand-in runs no kernel) run over the stand-in runtime (scripts/standin_check.sh), then failed
# at every place the runtime is called from (scripts/standin_faults.sh).
# (spelt without commas: nvcc's -Xcompiler splits its argument at them)
SAN_FLAGS := -fsanitize=address -fsanitize=undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
comma := ,
empty :=
space := $(empty) $(empty)
cuda-asan-build:
	@$(MAKE) --no-print-directory CUDA=1 BUILD=build-cuda-asan OBJ=build-asan KVCHAT=build-cuda-asan/kvchat OPT=-O1 \
		SAN="$(SAN_FLAGS)" NVARCH="-gencode arch=compute_90,code=sm_90" \
		NVHOST=",$(subst $(space),$(comma),$(SAN_FLAGS))" build-cuda-asan/kvchat build-cuda-asan/tests/gpu_bench

ifeq ($(CUDART_MAJOR),)
test-standin:
	@echo "test-standin: no CUDART_VERSION in $(CUDA_HOME)/include/cuda_runtime_api.h: the stand-in runtime was not built (set CUDA_HOME)"
else
test-standin: cuda-asan-build $(STANDIN_LIBS)
	bash scripts/standin_check.sh build-cuda-asan/kvchat $(STANDIN)
	bash scripts/standin_faults.sh build-cuda-asan/kvchat $(STANDIN)
endif

# The CUDA backend and its GPU tests compile and link (no GPU needed), within their register limits
# and with the decode products' and decode attention's reads in flight in the sm_90 code
# (scripts/check_sass_loads.sh, which fetches CUDA's disassembler into the private Python
# environment where the toolkit lacks it); test-gpu also runs them. The
# C and C++ objects are the CPU build's (see OBJ): only kernels/cuda/*.cu and the GPU tests compile
# here, and a C source that reads KVCHAT_CUDA (outside tests/gpu/) is refused, since the shared
# objects are compiled without it.
cuda-build:
	@if grep -rlw KVCHAT_CUDA --include='*.c' --include='*.h' --include='*.cpp' app common engine kernels store \
		ui tests | grep -v '^tests/gpu/'; then \
		echo "cuda-build: the files above name KVCHAT_CUDA; the objects shared with the CPU build lack it (see OBJ)"; \
		exit 1; fi
	@$(MAKE) --no-print-directory CUDA=1 BUILD=build-cuda OBJ=$(OBJ) KVCHAT=build-cuda/kvchat build-cuda/kvchat \
		build-cuda/tests/gpu_tests build-cuda/tests/gpu_bench
	@bash scripts/check_ptxas.sh kernels/cuda/ptxas_limits.txt $(patsubst %.cu,build-cuda/%.o.ptxas,$(wildcard kernels/cuda/*.cu))
	@bash scripts/check_sass_loads.sh build-cuda/kernels/cuda/vec_dot.o build-cuda/kernels/cuda/attn_rows.o
	@echo "CUDA build: build-cuda/kvchat, build-cuda/tests/gpu_tests and gpu_bench linked; kernels within kernels/cuda/ptxas_limits.txt"

test-gpu: cuda-build
	./build-cuda/tests/gpu_tests -j1

unit-tests: $(KVCHAT) $(UNIT_BIN)
	scripts/check_layers.sh
	./$(UNIT_BIN) -j2

# The sanitizer build runs several times slower: the terminal tests' waits get 180 s, not 20.
asan:
	@$(MAKE) --no-print-directory BUILD=build-asan KVCHAT=build-asan/kvchat OPT=-O1 \
		SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
		build-asan/kvchat build-asan/tests/unit_tests
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=tests/lsan.supp KVCHAT_BIN=build-asan/kvchat \
		KVCHAT_TUI_WAIT=180 ./build-asan/tests/unit_tests -j2

FUZZ_SECONDS ?= 60
FUZZ_BIN := build-fuzz/fuzz_gguf
# The harnesses themselves are compiled apart, with the project's warnings as errors.
FUZZ_CC := clang -std=c11 -g -O1 -D_GNU_SOURCE -I. -fno-sanitize-recover=undefined
build-fuzz/%.o: fuzz/%.c $(wildcard common/*.h engine/*.h engine/policy/*.h kernels/*.h)
	@mkdir -p build-fuzz
	$(FUZZ_CC) $(CWARN) -fsanitize=fuzzer,address,undefined -c $< -o $@
$(FUZZ_BIN): build-fuzz/fuzz_gguf.o engine/gguf.c common/quant.c common/files.c engine/gguf.h common/quant.h common/files.h
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined \
		build-fuzz/fuzz_gguf.o engine/gguf.c common/quant.c common/files.c -lm -o $@

# The snapshot fuzzer needs the whole engine (the parser restores into a live sequence), built
# with clang, libFuzzer and the sanitizers; the arithmetic loops in fuzz/snapshot-coverage-ignore.txt
# keep the sanitizers but are not traced for coverage (fuzz/README.md).
FUZZ_SNAP := build-fuzz/fuzz_snapshot
FUZZ_ENGINE_C := $(ENGINE_C) $(filter-out %_avx2.c %_avxvnni.c %_avx512.c,$(KERNEL_C))
FUZZ_SIMD_O := build-fuzz/vec_dot_avx2.o build-fuzz/vec_dot_avxvnni.o build-fuzz/vec_dot_avx512.o
build-fuzz/vec_dot_avx2.o: kernels/cpu/vec_dot_avx2.c kernels/cpu/vec_dot_impl.h
	@mkdir -p build-fuzz
	$(FUZZ_CC) -fsanitize=address,undefined $(AVX2FLAGS) -c $< -o $@
build-fuzz/vec_dot_avxvnni.o: kernels/cpu/vec_dot_avxvnni.c kernels/cpu/vec_dot_impl.h
	@mkdir -p build-fuzz
	$(FUZZ_CC) -fsanitize=address,undefined $(AVXVNNIFLAGS) -c $< -o $@
build-fuzz/vec_dot_avx512.o: kernels/cpu/vec_dot_avx512.c kernels/cpu/vec_dot_impl.h
	@mkdir -p build-fuzz
	$(FUZZ_CC) -fsanitize=address,undefined $(AVX512FLAGS) -c $< -o $@
$(FUZZ_SNAP): build-fuzz/fuzz_snapshot.o fuzz/snapshot-coverage-ignore.txt $(FUZZ_ENGINE_C) $(FUZZ_SIMD_O) $(ENGINE_CXX) $(wildcard common/*.h engine/*.h engine/policy/*.h kernels/*.h kernels/cpu/*.h)
	clang++ -std=c++17 -g -O1 -I. -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-sanitize=vptr -c engine/spm_shim.cpp -o build-fuzz/spm_shim.o
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -fsanitize-coverage-ignorelist=fuzz/snapshot-coverage-ignore.txt \
		build-fuzz/fuzz_snapshot.o $(FUZZ_ENGINE_C) $(FUZZ_SIMD_O) \
		build-fuzz/spm_shim.o -lsentencepiece -lsqlite3 -lnettle -lstdc++ -lm -pthread -o $@

# The eval CSV reader (what `eval` resumes from and `eval --report` redraws from).
FUZZ_CSV := build-fuzz/fuzz_evalcsv
$(FUZZ_CSV): build-fuzz/fuzz_evalcsv.o app/eval/evalres.c common/files.c common/text.c app/eval/evalres.h common/files.h common/text.h
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined \
		build-fuzz/fuzz_evalcsv.o app/eval/evalres.c common/files.c common/text.c -lm -o $@

test-fuzz-smoke: $(FUZZ_BIN) $(FUZZ_SNAP) $(FUZZ_CSV)
	scripts/fuzz_smoke.sh

fuzz: $(FUZZ_BIN) $(FUZZ_SNAP) $(FUZZ_CSV)
	@mkdir -p build-fuzz/corpus build-fuzz/corpus-snap build-fuzz/corpus-csv
	cp -n fuzz/corpus/gguf/* build-fuzz/corpus/ 2>/dev/null || true
	./$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build-fuzz/corpus fuzz/corpus/gguf
	FUZZ_SNAPSHOT_SEED_DIR=build-fuzz/corpus-snap ./$(FUZZ_SNAP) -max_total_time=$(FUZZ_SECONDS) \
		-max_len=65536 build-fuzz/corpus-snap
	./$(FUZZ_CSV) -max_total_time=$(FUZZ_SECONDS) -max_len=16384 build-fuzz/corpus-csv fuzz/corpus/evalcsv

bench: model $(KVCHAT)
	./$(KVCHAT) bench -m $(DEFAULT_MODEL)

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-cuda build-cuda-asan $(KVCHAT) $(KVCHAT).kind

-include $(LIB_OBJ:.o=.d) $(APP_OBJ:.o=.d) $(UNIT_OBJ:.o=.d) $(MODEL_T_OBJ:.o=.d) $(GPU_T_OBJ:.o=.d) $(BUILD)/tests/gpu/bench_kernels.d \
         $(wildcard $(OBJ)/bench/*.d)
