# tandem: one build — build/libtandem.a (the kernel archive: host C from src/common, CUDA from
# kernels/) and bin/tandem-* (one tool per file in src/cmd). `make test` also builds the host code
# with AddressSanitizer and UndefinedBehaviorSanitizer into build/san/ and runs prove over t/.
# Parallel by default: the kernels take most of the build.
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
CUDA     ?= /usr/local/cuda
NVCC     ?= $(CUDA)/bin/nvcc
CC       ?= gcc
# Both targets every time: Hopper (the H200 we run on) and GB10 (the seed's board, e2m1 converter).
GENCODE  ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_121a,code=sm_121a
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Isrc/common -Ikernels
DEPFLAGS := -MMD -MP
NVFLAGS  ?= -O3 -g -lineinfo
NVFLAGS  += -std=c++17 $(GENCODE) -Isrc/common -Ikernels -Xcompiler -Wall,-Wextra -MMD -MP
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
JANSSON  := -Wl,-Bstatic -ljansson -Wl,-Bdynamic
LDLIBS   := $(JANSSON) -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 -lcublasLt -lcublas \
            -lcudart_static -lstdc++ -lm -ldl -lrt -lpthread

COMMON_SRC := $(wildcard src/common/*.c)
KERNEL_SRC := $(wildcard kernels/*.cu)
CMD_SRC    := $(wildcard src/cmd/*.c)
UNIT_SRC   := $(wildcard t/unit/*.c)
TOOLS      := $(patsubst src/cmd/%.c,bin/%,$(CMD_SRC))

COMMON_OBJ := $(patsubst src/common/%.c,build/common/%.o,$(COMMON_SRC))
KERNEL_OBJ := $(patsubst kernels/%.cu,build/kernels/%.o,$(KERNEL_SRC))
SAN_OBJ    := $(patsubst src/common/%.c,build/san/common/%.o,$(COMMON_SRC))
SAN_TOOLS  := $(patsubst src/cmd/%.c,build/san/bin/%,$(CMD_SRC))
SAN_UNITS  := $(patsubst t/unit/%.c,build/san/t/%,$(UNIT_SRC))
GPU_UNITS  := $(patsubst t/unit/%.c,build/t/%,$(UNIT_SRC))

.PHONY: all setup test test-gpu demo fuzz clean kerneltrace
all: $(TOOLS) $(GPU_UNITS)

# The set-up step: jansson's headers (Debian's libjansson-dev), installed when run as root.
build/.setup-ok: scripts/setup
	@sh scripts/setup
	@mkdir -p build && touch $@

build/common/%.o: src/common/%.c build/.setup-ok
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@
# Each kernel object's ptxas resource report (registers, stack, spills of every kernel, both
# targets) goes to build/kernels/%.res for t/kernel-resources.t; nvcc's other messages still show.
# One recipe makes both (a pattern rule's targets are made together).
build/kernels/%.o build/kernels/%.res: kernels/%.cu build/.setup-ok
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) --resource-usage -c $< -o build/kernels/$*.o 2>build/kernels/$*.res || \
	  { cat build/kernels/$*.res >&2; rm -f build/kernels/$*.res; exit 1; }
	@grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' build/kernels/$*.res >&2 || true
build/libtandem.a: $(COMMON_OBJ) $(KERNEL_OBJ)
	@rm -f $@
	ar rcs $@ $^
bin/%: src/cmd/%.c build/libtandem.a
	@mkdir -p $(@D)
	@mkdir -p build/dep
	$(CC) $(CFLAGS) -MMD -MP -MF build/dep/$(subst /,_,$@).d $< -o $@ build/libtandem.a $(LDLIBS)
build/t/%: t/unit/%.c build/libtandem.a
	@mkdir -p $(@D)
	@mkdir -p build/dep
	$(CC) $(CFLAGS) -MMD -MP -MF build/dep/$(subst /,_,$@).d -It $< -o $@ build/libtandem.a $(LDLIBS)

# Sanitized host code for the CPU tests (the CUDA objects are shared: device code is not instrumented).
build/san/common/%.o: src/common/%.c build/.setup-ok
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(SANFLAGS) -c $< -o $@
build/san/libtandem.a: $(SAN_OBJ) $(KERNEL_OBJ)
	@rm -f $@
	ar rcs $@ $^
build/san/bin/%: src/cmd/%.c build/san/libtandem.a
	@mkdir -p $(@D)
	@mkdir -p build/dep
	$(CC) $(CFLAGS) -MMD -MP -MF build/dep/$(subst /,_,$@).d $(SANFLAGS) $< -o $@ build/san/libtandem.a $(LDLIBS)
build/san/t/%: t/unit/%.c build/san/libtandem.a
	@mkdir -p $(@D)
	@mkdir -p build/dep
	$(CC) $(CFLAGS) -MMD -MP -MF build/dep/$(subst /,_,$@).d $(SANFLAGS) -It $< -o $@ build/san/libtandem.a $(LDLIBS)

# Variants for A/B runs (scripts/variant-build): with VARIANT=NAME, every kernels/*.cu and
# src/common/*.c again with the build-time knobs VARIANT_DEFS (-D flags such as -DTDM_NORM_VEC=0; the
# host objects too, for knobs the host reads through mm_layout.h) into build/variant-NAME/, and
# bin/TOOL-NAME, build/t/PROG-NAME linked against that archive; the same flags as the build.
ifdef VARIANT
VDIR := build/variant-$(VARIANT)
$(VDIR)/%.o: kernels/%.cu build/.setup-ok
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) $(VARIANT_DEFS) -c $< -o $@
$(VDIR)/common/%.o: src/common/%.c build/.setup-ok
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(VARIANT_DEFS) -c $< -o $@
$(VDIR)/libtandem.a: $(patsubst src/common/%.c,$(VDIR)/common/%.o,$(COMMON_SRC)) $(patsubst kernels/%.cu,$(VDIR)/%.o,$(KERNEL_SRC))
	@rm -f $@
	ar rcs $@ $^
bin/%-$(VARIANT): src/cmd/%.c $(VDIR)/libtandem.a
	$(CC) $(CFLAGS) $< -o $@ $(VDIR)/libtandem.a $(LDLIBS)
build/t/%-$(VARIANT): t/unit/%.c $(VDIR)/libtandem.a
	$(CC) $(CFLAGS) -It $< -o $@ $(VDIR)/libtandem.a $(LDLIBS)
endif

# libFuzzer targets for the safetensors and token-file parsers (clang).
FUZZ_SRC := $(wildcard t/fuzz/*.c)
FUZZERS  := $(patsubst t/fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))
build/fuzz/%: t/fuzz/%.c $(COMMON_SRC) build/.setup-ok
	@mkdir -p $(@D)
	clang -std=c11 -D_GNU_SOURCE -O1 -g -Isrc/common -fsanitize=fuzzer,address,undefined \
	  $< src/common/safetensors.c src/common/tokens.c src/common/err.c src/common/dtype.c \
	  src/common/fileio.c -o $@ $(JANSSON) -lm
fuzz: $(FUZZERS)

test: all $(KERNEL_OBJ:.o=.res) $(SAN_TOOLS) $(SAN_UNITS) $(FUZZERS)
	prove -j2 -r t/
test-gpu: all
	prove t/gpu/

demo: all
	sh scripts/demo

# A measuring aid, not part of the tools (bench/kerneltrace.c; scripts/gpu-run gaps): needs CUPTI.
kerneltrace: build/kerneltrace.so
build/kerneltrace.so: bench/kerneltrace.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -O2 -Wall -Wextra -fPIC -shared -I$(CUDA)/include $< -o $@ -L$(CUDA)/lib64 -lcupti -lstdc++ -Wl,-rpath,$(CUDA)/lib64

clean:
	rm -rf build bin

-include $(COMMON_OBJ:.o=.d) $(KERNEL_OBJ:.o=.d) $(SAN_OBJ:.o=.d) $(wildcard build/dep/*.d)
