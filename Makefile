# paradec — a new user needs two commands: `make run` and `make test`.
#   make            build the library and the tools into bin/
#   make run        convert the default model (stories260K) and tell a story
#   make test       every test; the last line says "N passed, N failed"
#   make bench      speed figures for docs/benchmarks.md (never part of the tests)
#   make models     fetch SmolLM2-135M-Instruct and the reference tools (make test does)
#   make recipe=NAME  recipes/NAME.yaml's pipeline into out/NAME/: model, heads, bundle, bench tables
#   make SAN=1 ...  the same with AddressSanitizer + UBSan, in build-san/
#   make CUDA=1 ... the same with the "cuda" device (nvcc), in build-cuda/

BUILD  ?= build
BIN    ?= bin
OPT    ?= -O2 -march=native
ifeq ($(SAN),1)
BUILD  := build-san
BIN    := build-san/bin
# -O2: the same checks as at -O1, and the suite's forward passes run about twice as fast
OPT    := -O2 -march=native -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
LDFLAGS += -fsanitize=address,undefined
endif
# make CUDA=1: the same with the "cuda" device (kernels/cuda through nvcc, the CUDA
# runtime linked statically; cuBLAS, for --fast-prefill, from the toolkit's lib64), in build-cuda/
ifeq ($(CUDA),1)
BUILD     := build-cuda
BIN       := build-cuda/bin
NVCC      ?= $(firstword $(shell command -v nvcc) /usr/local/cuda/bin/nvcc)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CFLAGS    += -DPD_CUDA -I$(CUDA_HOME)/include
LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart_static -ldl -lrt
endif
# -ffp-contract=off: every product and sum rounds on its own in plain C too (gcc's ISO
# default; clang would fuse a*b+c), so kernels and their tests agree bit for bit
CFLAGS += -std=c11 $(OPT) $(NO_VNNI) -ffp-contract=off -g -pthread -Wall -Wextra -Werror -D_GNU_SOURCE -Ilibcore -Ikernels
# gcc 12 vectorizes a sum of signed-byte products with vpdpbusd, which multiplies unsigned
# bytes by signed ones: wrong sums (Debian's 12.2 on a Zen 4 EPYC). So no file may use
# VNNI but those whose intrinsics need it (no such loop is compiled in them beside VNNI).
NO_VNNI  := -mno-avxvnni -mno-avx512vnni
VNNI_SRC := kernels/cpu/quant.c kernels/cpu/quant_k.c kernels/cpu/qmatvec.c kernels/cpu/pool.c
$(VNNI_SRC:%.c=$(BUILD)/obj/%.o): NO_VNNI :=
LDLIBS += -lzstd -ljansson -lyaml -lxxhash -lpcre2-8 -lz -lpthread -lm -lstdc++

# what --version prints; a tool is rebuilt when the commit it would name changes
PD_VERSION := 0.21
PD_COMMIT  := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
COMMIT_STAMP := $(BUILD)/.commit-$(PD_COMMIT)

# libcore/FOLDER/*.c, in the folders libcore/LAYERS lists (tests/test_layers.sh checks their includes)
LIB_SRC  := $(wildcard libcore/*/*.c kernels/cpu/*.c)
# and the CUDA kernels built for the host under cuemu.h (the "cuemu" device)
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
CUEMU_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/obj/cuemu/%.o)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CUEMU_OBJ)
ifeq ($(CUDA),1)
GPU_OBJ   := $(CUDA_SRC:%.cu=$(BUILD)/obj/gpu/%.o)
LIB_OBJ   += $(GPU_OBJ) $(BUILD)/obj/kernels/cuda/device_cuda.o
endif
LIB      := $(BUILD)/libcore.a
TOOLS    := $(patsubst tools/%.c,$(BIN)/%,$(wildcard tools/*.c))
TESTS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
DEPS_OK  := $(BUILD)/.deps-ok

.PHONY: all run test bench clean deps models
all: $(TOOLS)

deps $(DEPS_OK): scripts/setup.sh
	@scripts/setup.sh
	@mkdir -p $(BUILD) && touch $(DEPS_OK)

$(BUILD)/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# made afresh: `ar r` keeps members whose source is gone (a renamed file), and an old
# member would still define its symbols
$(LIB): $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(COMMIT_STAMP): | $(DEPS_OK)
	@rm -f $(BUILD)/.commit-* && touch $@

$(BIN)/%: tools/%.c $(LIB) $(COMMIT_STAMP) | $(DEPS_OK)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -DPD_VERSION='"$(PD_VERSION)"' -DPD_COMMIT='"$(PD_COMMIT)"' -MMD -MP -MF $(BUILD)/obj/tool-$*.d $< $(LIB) -o $@ $(LDFLAGS) $(LDLIBS)

$(BIN)/serve: LDLIBS += -lmicrohttpd

$(BUILD)/tests/%: tests/%.c $(LIB) | $(DEPS_OK)
	@mkdir -p $(BUILD)/tests
	$(CC) $(CFLAGS) -Itests -MMD -MP -MF $(BUILD)/obj/test-$*.d $< $(LIB) -o $@ $(LDFLAGS) $(LDLIBS)

# the CUDA kernels under cuemu (kernels/cuda/cuemu.h): each .cu built by the host C++
# compiler, each fiber a CUDA thread; tests/test_cuemu*.cpp compare them with kernels/cpu
# bit for bit. In SAN=1 they take the sanitizer flags too (ASan follows swapcontext).
CUEMU_TESTS := $(patsubst tests/%.cpp,$(BUILD)/tests/%,$(wildcard tests/test_cuemu*.cpp))
CUEMU_FLAGS  = -std=c++17 $(OPT) $(NO_VNNI) -ffp-contract=off -g -Wall -Wextra -Werror -DCUEMU -Ikernels -Itests
TESTS       += $(CUEMU_TESTS)
$(BUILD)/obj/cuemu/%.o: %.cu | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(CUEMU_FLAGS) -MMD -MP -x c++ -c $< -o $@
$(CUEMU_TESTS): $(BUILD)/tests/%: tests/%.cpp $(LIB) | $(DEPS_OK)
	@mkdir -p $(BUILD)/tests
	$(CXX) $(CUEMU_FLAGS) -MMD -MP -MF $(BUILD)/obj/test-$*.d $< $(LIB) -o $@ $(LDFLAGS) $(LDLIBS)

$(BUILD)/obj/gpu/%.o: %.cu | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -fmad=false -Ikernels -Werror all-warnings -gencode arch=compute_90a,code=sm_90a \
	    -gencode arch=compute_80,code=sm_80 -MMD -MP -c $< -o $@

# what tests/gpu/run.sh needs on a GPU machine, which reaches no registry: the CUDA
# build's tools and test_device, the test model, its heads and a 2-layer draft, in build-gpu/
GPU_TOOLS := decode verifycost widen membw distill-heads train-medusa convert
.PHONY: gpu-pack
gpu-pack: $(DEFAULT_MODEL) $(TEST_HEADS) $(BIN)/distill-heads $(BIN)/convert
	$(MAKE) CUDA=1 $(GPU_TOOLS:%=build-cuda/bin/%) build-cuda/tests/test_device
	@rm -rf build-gpu && mkdir -p build-gpu/bin build-gpu/tests
	cp $(GPU_TOOLS:%=build-cuda/bin/%) build-gpu/bin/ && cp build-cuda/tests/test_device build-gpu/tests/
	cp $(DEFAULT_MODEL) $(TEST_HEADS) build-gpu/
	gzip -dc $(TINYSTORIES) | head -c 20000 >build-gpu/small.txt
	$(BIN)/distill-heads -m $(DEFAULT_MODEL) --steps 3 --batch 2 --seq-len 64 --data build-gpu/small.txt --layers 2 \
	    --norm 1 -o build-gpu/h.safetensors 2>/dev/null
	$(BIN)/convert $(DEFAULT_MODEL) --layers 2 --heads build-gpu/h.safetensors -o build-gpu/draft.safetensors 2>/dev/null
	@rm -f build-gpu/small.txt build-gpu/h.safetensors
	@mkdir -p build-gpu/data/datasets/tinystories && gzip -dc $(TINYSTORIES) | head -c 20000 | gzip \
	    >build-gpu/data/datasets/tinystories/tinystories_val_sample.txt.gz
	@mkdir -p build-gpu/lib && ldd build-gpu/bin/* | awk '/=> \// {print $$3}' | sort -u | \
	    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcublas[^/]*|libcublasLt[^/]*)\.so' | \
	    xargs -r cp -L -t build-gpu/lib && du -sh build-gpu

# the same .cu files through nvcc for sm_90a and sm_80 (tests/test_cuda_build.sh; SKIP without nvcc)
.PHONY: nvcc-check
nvcc-check:
	@NVCC_ONLY=1 sh tests/test_cuda_build.sh

# the kernels twice, as this machine runs them and as the scalar spec (no AVX, no FMA
# instructions): tests/test_kernel_spec.sh runs both on one seed and compares every output
KERNEL_SRC := $(wildcard kernels/cpu/*.c)
KSPEC      := $(BUILD)/kspec/native $(BUILD)/kspec/avx2 $(BUILD)/kspec/avxvnni $(BUILD)/kspec/scalar
$(BUILD)/kspec/native: tests/kernel_dump.c $(KERNEL_SRC:%.c=$(BUILD)/obj/%.o) $(CUEMU_OBJ) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDFLAGS) -lpthread -lm -lstdc++
# the AVX2 paths on a machine with AVX-512 too (where native is AVX2, the same build)
$(BUILD)/kspec/avx2: tests/kernel_dump.c $(KERNEL_SRC) $(CUEMU_OBJ) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -mno-avx512f $^ -o $@ $(LDFLAGS) -lpthread -lm -lstdc++
# the AVX2 paths with AVX-VNNI's vpdpbusd (VEX), only in the files that may use VNNI;
# it runs where the CPU has avx_vnni
$(BUILD)/kspec/avxvnni: tests/kernel_dump.c $(KERNEL_SRC) $(CUEMU_OBJ) | $(DEPS_OK)
	@mkdir -p $@.o
	for f in $(VNNI_SRC); do $(CC) $(CFLAGS) -mno-avx512f -mavxvnni -c $$f -o $@.o/$$(basename $$f .c).o || exit 1; done
	$(CC) $(CFLAGS) -mno-avx512f $< $(filter-out $(VNNI_SRC),$(KERNEL_SRC)) $(VNNI_SRC:kernels/cpu/%.c=$@.o/%.o) \
		$(CUEMU_OBJ) -o $@ $(LDFLAGS) -lpthread -lm -lstdc++
$(BUILD)/kspec/scalar: tests/kernel_dump.c $(KERNEL_SRC) $(CUEMU_OBJ) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(subst -march=native,-march=x86-64-v2,$(CFLAGS)) $^ -o $@ $(LDFLAGS) -lpthread -lm -lstdc++

# the embedded default model: stories260K + tok512, found through pd_data_path's order
MODEL_DIR = $(firstword $(wildcard $(PARADEC_DATA)/models/stories260K data/models/stories260K ../shared/data/models/stories260K))
DEFAULT_MODEL := $(BUILD)/stories260K.safetensors.zst

$(DEFAULT_MODEL): $(BIN)/convert
	@test -n "$(MODEL_DIR)" || { echo "make: stories260K not found: set PARADEC_DATA to a folder holding models/stories260K/"; exit 1; }
	$(BIN)/convert $(MODEL_DIR)/stories260K.bin --tokenizer $(MODEL_DIR)/tok512.bin -o $@

run: all $(DEFAULT_MODEL)
	$(BIN)/decode -m $(DEFAULT_MODEL) -p "Once upon a time" -n 200 --temp 0.8 --seed $${SEED:-42}

# the real-model tests' inputs (SmolLM2, llama.cpp's vocab files, reference venv) in
# $$PARADEC_CACHE; offline, those tests skip and say so
models:
	@scripts/models.sh

# trained heads for the lossless tests (a short run each: trained heads draft and exit
# where identity or random ones seldom do)
# Without the TinyStories sample (a clone without ../shared) there are none: make test
# says so once and the tests of trained heads skip.
TINYSTORIES = $(firstword $(wildcard $(PARADEC_DATA)/datasets/tinystories/*.gz data/datasets/tinystories/*.gz ../shared/data/datasets/tinystories/*.gz))
TEST_HEADS := $(BUILD)/test-heads.safetensors.zst $(BUILD)/test-medusa.safetensors.zst \
              $(BUILD)/test-eagle.safetensors.zst
ifneq ($(TINYSTORIES),)
$(BUILD)/test-heads.safetensors.zst: $(BIN)/distill-heads $(DEFAULT_MODEL)
	$(BIN)/distill-heads -m $(DEFAULT_MODEL) --data $(TINYSTORIES) --layers 1,2,3,4 --steps 300 --seq-len 128 -o $@ 2>/dev/null
$(BUILD)/test-medusa.safetensors.zst: $(BIN)/train-medusa $(DEFAULT_MODEL)
	$(BIN)/train-medusa -m $(DEFAULT_MODEL) --data $(TINYSTORIES) --heads 4 --own-lm-head --generate 8 --seq-len 72 --steps 400 -o $@ 2>/dev/null
$(BUILD)/test-eagle.safetensors.zst: $(BIN)/train-medusa $(DEFAULT_MODEL)
	$(BIN)/train-medusa -m $(DEFAULT_MODEL) --data $(TINYSTORIES) --eagle --generate 8 --seq-len 72 --steps 400 -o $@ 2>/dev/null
else
TEST_HEADS := test-heads-skipped
.PHONY: test-heads-skipped
test-heads-skipped:
	@echo "SKIP test heads: no datasets/tinystories/*.gz under \$$PARADEC_DATA, data/ or ../shared/data: the tests of trained heads skip"
endif

# ---- make test runs the suite twice: on the normal build, then on build-san/ (SAN=1:
# AddressSanitizer + UBSan), with the normal build's model and test heads and
# PARADEC_SAN=1, which makes the heaviest tests do less; its lines start "san: ", and
# the last line sums both runs. make SAN=1 test runs the sanitizer build alone. ----
ifeq ($(SAN),1)
SAN_ENV  := PARADEC_SAN=1
else
SAN_BINS := san-bins
SAN_RUN   = for f in $(TEST_HEADS); do [ ! -f $$f ] || cp -p $$f build-san/; done; BUILD=build-san BIN=build-san/bin MODEL=$(DEFAULT_MODEL) PARADEC_SAN=1 \
            tests/run.sh | sed -u '/^[0-9]* passed, [0-9]* failed$$/!s/^/san: /';
endif
.PHONY: san-bins test-bins
san-bins:
	@$(MAKE) --no-print-directory SAN=1 test-bins
test-bins: all $(TESTS) $(KSPEC)

test: all $(TESTS) $(KSPEC) $(DEFAULT_MODEL) $(TEST_HEADS) models $(SAN_BINS)
	@{ BUILD=$(BUILD) BIN=$(BIN) MODEL=$(DEFAULT_MODEL) $(SAN_ENV) tests/run.sh; $(SAN_RUN) } | tests/totals.sh $(if $(SAN_BINS),2,1)

bench: all $(DEFAULT_MODEL)
	@BUILD=$(BUILD) BIN=$(BIN) MODEL=$(DEFAULT_MODEL) scripts/bench.sh
	@$(if $(TINYSTORIES),BUILD=$(BUILD) BIN=$(BIN) MODEL=$(DEFAULT_MODEL) scripts/bench_drafters.sh,\
	    echo "SKIP bench_drafters.sh: its heads train on datasets/tinystories/*.gz: not under \$$PARADEC_DATA, data/ or ../shared/data")

clean:
	rm -rf build build-san bin

# ---- make fuzz: one libFuzzer binary per parser of outside input (tests/fuzz/targets.h),
# built with clang into build-fuzz/. make fuzz-run SECONDS=N (or RUNS=N) runs them one at
# a time from their seeds, tests/fuzz/corpus/NAME/ (tests/fuzz/seeds.py makes those). ----
FUZZ_DIR     := build-fuzz
FUZZ_TARGETS := safetensors safetensors_zst llama2c tokenizer_bin tokenizer_json hf_config gguf dataset \
                recipe medusa_tree serve_request serve_generate
FUZZ_CFLAGS  := -std=c11 -O1 -march=native -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
                -fno-sanitize-recover=all -pthread -Wall -Wextra -Werror -D_GNU_SOURCE -Ilibcore -Ikernels
FUZZ_LIB     := $(FUZZ_DIR)/libcore.a
SECONDS      ?= 60
RUNS         ?= 0
.PHONY: fuzz fuzz-run fuzz-clean
fuzz: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
clean: fuzz-clean
fuzz-clean:
	rm -rf $(FUZZ_DIR)

$(FUZZ_DIR)/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_LIB): $(LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o)
	@rm -f $@
	$(AR) rcs $@ $^

$(FUZZ_DIR)/fuzz_%: tests/fuzz/main.c tests/fuzz/targets.c tests/fuzz/targets.h $(FUZZ_LIB)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -DFUZZ_TARGET=fuzz_$* tests/fuzz/main.c tests/fuzz/targets.c \
	    $(FUZZ_LIB) -o $@ $(LDLIBS)

fuzz-run: fuzz
	@FUZZ_DIR=$(FUZZ_DIR) tests/fuzz/run.sh $(SECONDS) $(RUNS) $(FUZZ_TARGETS)

-include $(shell find $(FUZZ_DIR)/obj -name '*.d' 2>/dev/null)

# ---- make recipe=NAME (or recipe=path/to/file.yaml): convert → heads → pack → bench into
# out/NAME/. bin/recipe writes the stage rules (one stamp file per stage's settings, so a
# second run redoes only what changed); docs/recipes.md says more. ----
ifdef recipe
RECIPE_FILE := $(if $(filter %.yaml,$(recipe)),$(recipe),recipes/$(recipe).yaml)
RECIPE_NAME := $(basename $(notdir $(RECIPE_FILE)))
ifeq ($(wildcard $(RECIPE_FILE)),)
$(error recipe=$(recipe): no $(RECIPE_FILE) (recipes: $(basename $(notdir $(wildcard recipes/*.yaml)))))
endif
RECIPE_OUT ?= out
RECIPE_MK := $(BUILD)/recipe/$(RECIPE_NAME).mk
.DEFAULT_GOAL := recipe
.PHONY: recipe recipe-rules
.DELETE_ON_ERROR:
# always asked, written only when its text changes: the recipe, an environment variable
# it names or the data may have changed. An empty one first, so that a bad recipe stops
# make with its own one-line reason rather than "No such file".
$(shell mkdir -p $(BUILD)/recipe && { test -f $(RECIPE_MK) || : >$(RECIPE_MK); })
$(RECIPE_MK): $(BIN)/recipe recipe-rules
	@$(BIN)/recipe rules $(RECIPE_FILE) --out $(RECIPE_OUT)/$(RECIPE_NAME) --stamps $(BUILD)/recipe/$(RECIPE_NAME) -o $@
include $(RECIPE_MK)
endif

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
