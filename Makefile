# beamd top-level build. Out of tree into $(BUILD); nothing is written elsewhere.
#
#   make                 build daemon, tools, tests (CUDA if nvcc is found)
#   make CUDA=0          force a CPU-only build (gpu/stubs.c instead of gpu/*.cu)
#   make check           unit tests (cmocka) + integration tests (pytest, loopback)
#   make check-unit      unit tests only;  make check-gpu: GPU cross-checks only
#   make SANITIZER=address|undefined|thread check-unit
#   make bench           benchmarks (figures, not pass/fail)
#   make soak            every stage kind for SOAK_MINUTES (20): RSS, fds, queues, losses
#   make fuzz            run every decoder fuzzer (tests/fuzz/fuzz_*.c) for FUZZ_SECONDS each
#   make deps            install the Debian packages everything here needs
#   make install         binaries, man pages, unit, sysusers file, minimal
#                        /etc/beamd/beamd.yaml (DESTDIR, PREFIX honoured);
#                        make uninstall removes them

# `make deps <targets>` installs packages before anything below asks
# pkg-config for flags, so one command works on a fresh machine.
ifneq ($(filter deps,$(MAKECMDGOALS)),)
DEPS_OUT := $(shell tools/install-deps.sh >&2; echo $$?)
ifneq ($(DEPS_OUT),0)
$(error tools/install-deps.sh failed)
endif
endif

SANITIZER ?=
ifeq ($(SANITIZER),)
BUILD     ?= build
SANFLAGS  :=
else ifeq ($(SANITIZER),address)
BUILD     ?= build/san-address
SANFLAGS  := -fsanitize=address -fno-omit-frame-pointer
else ifeq ($(SANITIZER),undefined)
BUILD     ?= build/san-undefined
SANFLAGS  := -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else ifeq ($(SANITIZER),address,undefined)
BUILD     ?= build/san-asan-ubsan
SANFLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else ifeq ($(SANITIZER),thread)
BUILD     ?= build/san-thread
SANFLAGS  := -fsanitize=thread -fno-omit-frame-pointer
else ifeq ($(SANITIZER),fuzzer)
# The libraries for `make fuzz` (clang): coverage for libFuzzer, ASan, UBSan.
BUILD     ?= build/san-fuzzer
SANFLAGS  := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
             -Wno-ignored-attributes # gcc-only target attributes (prefer-vector-width)
else
$(error SANITIZER must be address, undefined, address,undefined, thread or fuzzer (got "$(SANITIZER)"))
endif

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
CUDA      ?= $(if $(NVCC),1,0)
# The H200 is sm_90; sm_80 covers A100 nodes. No GPU here, so "native" cannot be used.
CUDA_ARCH ?= 80 90
PYTHON    ?= /usr/bin/python3
PREFIX    ?= /usr/local
FUZZ_SECONDS ?= 60

ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but no nvcc found (set NVCC= or CUDA_HOME=))
endif
endif

PKGS      := libzmq libuv yaml-0.1 hdf5 fftw3 fftw3f jansson liblz4 libzstd libmd libsystemd openblas msgpack
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lfftw3f_threads -lfftw3_threads -llapacke

CC        ?= cc
OPT       ?= -O2
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -Wstrict-prototypes \
               -Werror=implicit-function-declaration -Wno-unused-parameter -pthread -fPIC -I. \
               $(PKG_CFLAGS) $(SANFLAGS)
CFLAGS_BASE += -DBEAM_CUDA=$(CUDA)
LDLIBS_BASE := $(PKG_LIBS) -lm -pthread -fopenmp
# Only the tools that need them link MPI (beamd-ptycho, beamd-fit) and libwebsockets
# (beamd-view); see the per-tool settings below the link rules.
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null)
LWS_CFLAGS := $(shell pkg-config --cflags libwebsockets 2>/dev/null)
LWS_LIBS   := $(shell pkg-config --libs libwebsockets 2>/dev/null)
ifeq ($(CUDA),1)
CUDA_LIBDIR := $(CUDA_HOME)/lib64
LDLIBS_BASE += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcufft -lcublas -lcudart
NVCCFLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-Wno-unused-parameter -Werror all-warnings \
             $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) -I. $(PKG_CFLAGS)
endif

$(info beamd: CUDA=$(CUDA) nvcc=$(or $(NVCC),none) arch=$(if $(filter 1,$(CUDA)),$(CUDA_ARCH),-) san=$(or $(SANITIZER),none) build=$(BUILD))

# ---- sources --------------------------------------------------------------
LIB_SRC   := $(wildcard proto/*.c pipeline/*.c pipeline/kern/*.c pipeline/ptycho/*.c)
GPU_C     := $(filter-out gpu/stubs.c,$(wildcard gpu/*.c))
ifeq ($(CUDA),1)
GPU_CU    := $(wildcard gpu/*.cu)
GPU_OBJ   := $(GPU_CU:%.cu=$(BUILD)/%.o) $(GPU_C:%.c=$(BUILD)/%.o)
else
GPU_OBJ   := $(BUILD)/gpu/stubs.o $(GPU_C:%.c=$(BUILD)/%.o)
endif
DAEMON_SRC := $(filter-out daemon/main.c,$(wildcard daemon/*.c))
TOOLS      := $(notdir $(patsubst %/,%,$(dir $(wildcard tools/*/main.c))))
# tools/common has no main.c, so it is no tool: its objects link into every tool.
TOOL_COMMON_SRC := $(wildcard tools/common/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
GPUT_SRC   := $(wildcard tests/gpu/test_*.c)
# failalloc.c only links into the fault-injection sweep (FAILALLOC below).
TEST_COMMON := $(filter-out tests/common/failalloc.c,$(wildcard tests/common/*.c))
BENCH_SRC  := $(wildcard bench/*.c)
# Small drivers the integration tests run (e.g. the DM engine on raw files).
TESTTOOL_SRC := $(wildcard tests/tools/*.c)

LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/%.o) $(GPU_OBJ)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(BUILD)/%.o)
LIBBEAM    := $(BUILD)/libbeam.a
LIBBEAMD   := $(BUILD)/libbeamd.a
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
GPUT_BIN   := $(GPUT_SRC:tests/gpu/%.c=$(BUILD)/tests/%)
TOOL_BIN   := $(TOOLS:%=$(BUILD)/%)
# Tools written in Python: copied with beamd's version filled in.
SCRIPTS    := beamd-pca-rebuild
SCRIPT_BIN := $(SCRIPTS:%=$(BUILD)/%)
BEAMD_VERSION := $(shell sed -n 's/^\#define BEAMD_VERSION "\(.*\)"$$/\1/p' daemon/version.h)
BENCH_BIN  := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
TESTTOOL_BIN := $(TESTTOOL_SRC:tests/tools/%.c=$(BUILD)/tests/tools/%)
TEST_COMMON_OBJ := $(TEST_COMMON:%.c=$(BUILD)/%.o)
TOOL_COMMON_OBJ := $(TOOL_COMMON_SRC:%.c=$(BUILD)/%.o)

ALL_OBJ := $(LIB_OBJ) $(DAEMON_OBJ) $(BUILD)/daemon/main.o $(TEST_COMMON_OBJ) $(BUILD)/tests/common/failalloc.o \
           $(foreach f,$(wildcard tools/*/*.c),$(BUILD)/$(basename $(f)).o) \
           $(UNIT_SRC:%.c=$(BUILD)/%.o) $(GPUT_SRC:%.c=$(BUILD)/%.o) $(BENCH_SRC:%.c=$(BUILD)/%.o) \
           $(TESTTOOL_SRC:%.c=$(BUILD)/%.o)

.PHONY: all check check-unit check-integration check-tsan soak check-gpu check-gpu-emu bench fuzz deps demo install clean print-config
all: $(BUILD)/beamd $(TOOL_BIN) $(SCRIPT_BIN) $(UNIT_BIN) $(GPUT_BIN) $(BENCH_BIN) $(TESTTOOL_BIN)

# Rebuild everything when flags change (Redis .make-settings idea).
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_NOW   := $(CC) $(CFLAGS_BASE) $(CFLAGS) $(LDLIBS_BASE) $(LDFLAGS) $(NVCCFLAGS) CUDA=$(CUDA)
$(shell mkdir -p $(BUILD); [ -f $(FLAGS_STAMP) ] && [ "$$(cat $(FLAGS_STAMP))" = '$(FLAGS_NOW)' ] || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP))

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -MMD -MP -c $< -o $@

# gcc 12 at -O2 vectorises only loops whose trip count is known; the
# per-pixel kernels need the full vectoriser (measured: correct 3.2x).
$(BUILD)/pipeline/kern/%.o: CFLAGS += -O3
# The fitter's SIMD pass: selects instead of branches need no FP traps,
# and FMA contraction where the ISA variant has it (docs/fit.md).
$(BUILD)/pipeline/kern/fit_cpu.o: CFLAGS += -fno-math-errno -fno-trapping-math -ffp-contract=fast
# The DM engine's per-view loops are OpenMP parallel (threads = conf.threads).
# No errno from sqrt and no FP traps: lets the modulus loop vectorise.
# Under ThreadSanitizer the DM engine is built without OpenMP (its
# libgomp barriers are invisible to TSan): the pragmas are ignored and the
# omp_get_* calls answer for one thread, so it runs serially.
ifeq ($(SANITIZER),thread)
OMP_CFLAGS := -Wno-unknown-pragmas
else
OMP_CFLAGS := -fopenmp
endif
$(BUILD)/pipeline/ptycho/%.o: CFLAGS += -O3 $(OMP_CFLAGS) -fno-math-errno -fno-trapping-math
$(BUILD)/tools/beamd-ptycho/%.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/tools/beamd-fit/%.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/tools/beamd-view/%.o: CFLAGS += $(LWS_CFLAGS)

$(BUILD)/gpu/%.o: gpu/%.cu $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIBBEAM): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIBBEAMD): $(DAEMON_OBJ)
	@rm -f $@
	ar rcs $@ $^

LINK = $(CC) $(SANFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS_BASE) $(LDLIBS_EXTRA)
ifeq ($(CUDA),1)
LINK += -lstdc++
endif

$(BUILD)/beamd-ptycho: LDLIBS_EXTRA = $(MPI_LIBS) -lpng
$(BUILD)/beamd-view: LDLIBS_EXTRA = $(LWS_LIBS)
# beamd-fit reads scans through beamd-replay's frame source (same layouts,
# same codecs); these objects join its own at the end of $^, after the
# libraries, so the libraries are named once more behind them.
$(BUILD)/beamd-fit: LDLIBS_EXTRA = $(MPI_LIBS) $(LIBBEAMD) $(LIBBEAM) $(LDLIBS_BASE)
$(BUILD)/beamd-fit: $(BUILD)/tools/beamd-replay/h5src.o $(BUILD)/tools/beamd-replay/chunk.o

$(BUILD)/beamd: $(BUILD)/daemon/main.o $(LIBBEAMD) $(LIBBEAM)
	$(LINK)

.SECONDARY:
.SECONDEXPANSION:
$(TOOL_BIN): $(BUILD)/%: $$(foreach f,$$(wildcard tools/$$*/*.c),$(BUILD)/$$(basename $$(f)).o) $(TOOL_COMMON_OBJ) $(LIBBEAMD) $(LIBBEAM)
	$(LINK)

$(SCRIPT_BIN): $(BUILD)/%: tools/% daemon/version.h
	@mkdir -p $(@D)
	sed 's/^VERSION = None$$/VERSION = "$(BEAMD_VERSION)"/' $< > $@.tmp
	grep -q '^VERSION = "$(BEAMD_VERSION)"$$' $@.tmp
	chmod 755 $@.tmp && mv $@.tmp $@

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(TEST_COMMON_OBJ) $(LIBBEAMD) $(LIBBEAM)
	$(LINK) -lcmocka

# The allocation-failure sweep: every allocation of beamd's own code in it
# goes through tests/common/failalloc.c.
FAILALLOC_LDFLAGS := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup \
                     -Wl,--wrap=posix_memalign,--wrap=aligned_alloc
$(BUILD)/tests/test_alloc_fail: $(BUILD)/tests/unit/test_alloc_fail.o $(BUILD)/tests/common/failalloc.o \
                                $(TEST_COMMON_OBJ) $(LIBBEAMD) $(LIBBEAM)
	$(LINK) $(FAILALLOC_LDFLAGS) -lcmocka

$(GPUT_BIN): $(BUILD)/tests/%: $(BUILD)/tests/gpu/%.o $(TEST_COMMON_OBJ) $(LIBBEAMD) $(LIBBEAM)
	$(LINK) -lcmocka

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIBBEAMD) $(LIBBEAM)
	$(LINK)

# zthroughput takes the tools' CURVE options (bench/curve.py), so it links
# their common objects; an explicit rule wins over the pattern above.
$(BUILD)/bench/zthroughput: $(BUILD)/bench/zthroughput.o $(TOOL_COMMON_OBJ) $(LIBBEAMD) $(LIBBEAM)
	$(LINK)

$(TESTTOOL_BIN): $(BUILD)/tests/tools/%: $(BUILD)/tests/tools/%.o $(LIBBEAMD) $(LIBBEAM)
	$(LINK)

# ---- tests ------------------------------------------------------------------
check: check-unit check-integration

# Under ThreadSanitizer: libzmq suppressed (tests/tsan.supp says why),
# OpenMP and OpenBLAS on one thread (their synchronisation is invisible).
ifeq ($(SANITIZER),thread)
TEST_ENV := TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
            OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
endif
# The daemon integration tests that exercise threads: pull and drain
# (flow), replay, fan-out (one stage's many outputs to PUB and PUSH:
# xpcs_multitau), reload, control; less the ones that compare timings,
# which the sanitizer's 5-15x slowdown voids.
TSAN_ITESTS ?= tests/integration/test_daemon_flow.py tests/integration/test_daemon_replay.py \
               tests/integration/test_daemon_reload.py tests/integration/test_daemon_control.py \
               tests/integration/test_xpcs_multitau.py
TSAN_SKIP ?= not does_not_spin and not does_not_slow

check-unit: $(UNIT_BIN) $(GPUT_BIN) $(BUILD)/beamd
	@$(TEST_ENV) tests/run-unit.sh $(UNIT_BIN) $(GPUT_BIN)

check-integration: all
	$(TEST_ENV) BEAMD_BUILD=$(BUILD) $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration

# make SANITIZER=thread check-tsan: the unit tests and TSAN_ITESTS against
# the TSan daemon; any report fails the daemon's exit and so the test.
# test_kern_fit is left out: the engine is single-threaded per call (its
# threads are the fit stage's, in test_fit_stage) and takes 90 s under TSan.
TSAN_UNIT := $(filter-out %/test_kern_fit,$(UNIT_BIN) $(GPUT_BIN))
check-tsan: $(TSAN_UNIT) all
	@$(TEST_ENV) tests/run-unit.sh $(TSAN_UNIT)
	$(TEST_ENV) BEAMD_BUILD=$(BUILD) $(PYTHON) -m pytest -q -p no:cacheprovider -k "$(TSAN_SKIP)" \
	  $(TSAN_ITESTS)

check-gpu: $(GPUT_BIN)
	@BEAM_REQUIRE_GPU=1 tests/run-unit.sh $(GPUT_BIN)

# The CUDA backends run on the host: gpu/*.cu rewritten by tests/emu/emulate.py
# (launches -> emu_launch), built as C++ against tests/emu/include (CUDA
# runtime, cuBLAS on CBLAS, cuFFT on FFTW; streams run at synchronisation,
# blocks one by one, threads as fibers where a kernel has barriers) and
# checked against the CPU backends by the cross-checks in tests/gpu.
# Each test runs twice, the second time with blocks and threads in reverse
# order (EMU_REVERSE=1), so a race between threads of one phase shows in one
# of the two. Host logic, kernel arithmetic, barriers, launch limits and
# copy bounds; not real concurrency (atomics racing), device rounding or speed.
# Needs the CPU-only library (its gpu/stubs.c loses to the emulated symbols).
EMU       := $(BUILD)/emu
CXX       ?= g++
EMU_CU    := common bin_cuda pca_cuda dm_cuda ptycho_dm_cuda xpcs_multitau_cuda xpcs_twotime_cuda \
             roi_sum_cuda correct_cuda preview_cuda fit_cuda fit_stage_cuda azint_cuda \
             fit_k_dcos fit_k_dcos2 fit_k_exp fit_k_peak com_cuda
EMU_TESTS := test_xcheck_pca test_xcheck_xpcs_multitau test_xcheck_xpcs_twotime test_xcheck_roi_sum \
             test_xcheck_correct test_xcheck_bin test_xcheck_preview test_dm_xcheck test_xcheck_fit \
             test_cuda_alloc_fail test_xcheck_com test_xcheck_azint
EMU_SRC   := $(patsubst gpu/%,$(EMU)/src/gpu/%,$(wildcard gpu/*.cu gpu/*.cuh))
EMU_OBJ   := $(EMU_CU:%=$(EMU)/%.o) $(EMU)/emu_rt.o
EMU_CXX    = $(CXX) -std=c++17 -O1 -g -ffp-contract=off $(SANFLAGS) -Wall -Wno-unused-parameter \
             -Wno-unused-function -MMD -MP -I$(EMU)/src -Itests/emu/include -I. $(PKG_CFLAGS)

$(EMU_SRC) &: $(wildcard gpu/*.cu gpu/*.cuh) tests/emu/emulate.py
	$(PYTHON) tests/emu/emulate.py . $(EMU)/src
$(EMU)/%.o: $(EMU)/src/gpu/%.cu $(FLAGS_STAMP)
	$(EMU_CXX) -x c++ -c $< -o $@
$(EMU)/emu_rt.o: tests/emu/emu_rt.cc $(FLAGS_STAMP)
	$(EMU_CXX) -c $< -o $@
$(EMU)/test_%: $(BUILD)/tests/gpu/test_%.o $(EMU_OBJ) $(TEST_COMMON_OBJ) $(LIBBEAMD) $(LIBBEAM)
	$(CXX) $(SANFLAGS) -o $@ $< $(EMU_OBJ) $(TEST_COMMON_OBJ) -Wl,--allow-multiple-definition \
	  $(LIBBEAMD) $(LIBBEAM) $(LDLIBS_BASE) -lcmocka

ifeq ($(CUDA),1)
check-gpu-emu:
	$(error check-gpu-emu needs a CPU-only build: make CUDA=0 check-gpu-emu)
else
check-gpu-emu: $(EMU_TESTS:%=$(EMU)/%)
	@set -e; for t in $^; do for r in 0 1; do echo "== $$t (EMU_REVERSE=$$r)"; \
	  EMU_REVERSE=$$r ASAN_OPTIONS=detect_odr_violation=0 $$t; done; done
endif
-include $(wildcard $(EMU)/*.d)

bench: all
	BEAMD_BUILD=$(BUILD) bench/run.sh

# Soak run, not a test: every stage kind at a steady rate (bench/soak.py).
SOAK_MINUTES ?= 20
soak: all
	$(PYTHON) bench/soak.py --build $(BUILD) --minutes $(SOAK_MINUTES)

FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
# Under $(BUILD) like every other output: the libraries built by clang for
# fuzzing, and the targets with their corpora.
FUZZ_LIBDIR := $(BUILD)/san-fuzzer
FUZZ_DIR := $(BUILD)/fuzz
FUZZ_LIBS := $(FUZZ_LIBDIR)/libbeamd.a $(FUZZ_LIBDIR)/libbeam.a
# Seeds beyond tests/fuzz/seeds, per target.
FUZZ_SEEDS_fuzz_config := tests/configs/good tests/configs/bad
# Sources beyond the libraries, per target (tool code).
FUZZ_EXTRA_fuzz_replay_json := tools/beamd-replay/request.c
# Every target links the daemon and pipeline libraries built by clang with
# coverage, ASan and UBSan (SANITIZER=fuzzer), so a target can reach any
# decoder or loader; each runs FUZZ_SECONDS.
define fuzz_one
clang -std=c11 -D_GNU_SOURCE -g -O1 -I. $(PKG_CFLAGS) -fsanitize=fuzzer,address,undefined $(2) \
  $(FUZZ_EXTRA_$(1)) $(FUZZ_LIBS) $(PKG_LIBS) -lm -pthread -fopenmp -o $(FUZZ_DIR)/$(1) && \
mkdir -p $(FUZZ_DIR)/corpus-$(1) && \
$(FUZZ_DIR)/$(1) -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 $(FUZZ_DIR)/corpus-$(1) \
  tests/fuzz/seeds $(FUZZ_SEEDS_$(1))
endef
fuzz:
	@mkdir -p $(FUZZ_DIR)
	$(MAKE) --no-print-directory CC=clang SANITIZER=fuzzer CUDA=0 OPT=-O1 BUILD=$(FUZZ_LIBDIR) $(FUZZ_LIBS)
	@set -e; $(foreach f,$(FUZZ_SRC),$(call fuzz_one,$(basename $(notdir $(f))),$(f));)

deps:
	@true # done while reading this Makefile (see the top)

demo: all
	BEAMD_BUILD=$(BUILD) tools/demo.sh

# ---- install ----------------------------------------------------------------
# Binaries, man pages and the viewer's page under PREFIX; the unit, the sysusers file
# and /etc/beamd where systemd looks, whatever PREFIX is. The config put in
# /etc is the minimal safe one (loopback, a preview, no disk writes); the
# full reference goes beside the documentation. Only the programs are
# built first (not the tests), so an install after a build compiles nothing.
UNITDIR     ?= /lib/systemd/system
SYSUSERSDIR ?= /usr/lib/sysusers.d
BINDIR      := $(PREFIX)/bin
DOCDIR      := $(PREFIX)/share/doc/beamd
VIEWDIR     := $(PREFIX)/share/beamd-view/www
VIEW_FILES  := $(notdir $(wildcard tools/beamd-view/www/*))
DOC_FILES   := $(notdir $(wildcard docs/*.md))
MANDIR      := $(PREFIX)/share/man/man1
MAN_FILES   := $(notdir $(wildcard man/man1/*.1))

.PHONY: uninstall
install: $(BUILD)/beamd $(TOOL_BIN) $(SCRIPT_BIN)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)/etc/beamd $(DESTDIR)$(UNITDIR) \
	  $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(DOCDIR)/docs $(DESTDIR)$(VIEWDIR) $(DESTDIR)$(MANDIR)
	install -m 755 $(BUILD)/beamd $(TOOL_BIN) $(SCRIPT_BIN) $(DESTDIR)$(BINDIR)/
	install -m 644 $(MAN_FILES:%=man/man1/%) $(DESTDIR)$(MANDIR)/
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' systemd/beamd.service.in \
	  > $(DESTDIR)$(UNITDIR)/beamd.service.tmp
	chmod 644 $(DESTDIR)$(UNITDIR)/beamd.service.tmp
	mv $(DESTDIR)$(UNITDIR)/beamd.service.tmp $(DESTDIR)$(UNITDIR)/beamd.service
	install -m 644 systemd/beamd.sysusers $(DESTDIR)$(SYSUSERSDIR)/beamd.conf
	install -m 644 etc/beamd.yaml $(DESTDIR)$(DOCDIR)/beamd.yaml.example
	install -m 644 README.md $(DESTDIR)$(DOCDIR)/README.md
	install -m 644 $(DOC_FILES:%=docs/%) $(DESTDIR)$(DOCDIR)/docs/
	install -m 644 $(VIEW_FILES:%=tools/beamd-view/www/%) $(DESTDIR)$(VIEWDIR)/
	@# An existing config is the operator's: never overwritten.
	@c=$(DESTDIR)/etc/beamd/beamd.yaml; \
	if [ ! -e $$c ]; then install -m 644 etc/beamd-minimal.yaml $$c; echo "installed $$c (minimal: loopback, preview, no disk writes)"; \
	elif cmp -s etc/beamd-minimal.yaml $$c; then echo "$$c: unchanged"; \
	else install -m 644 etc/beamd-minimal.yaml $$c.new; \
	  echo "$$c exists and was kept; the new minimal config is $$c.new"; fi
	@# Only on the real system: a DESTDIR is a staging tree (a package).
	@if [ -z "$(DESTDIR)" ] && command -v systemd-sysusers >/dev/null; then \
	  systemd-sysusers $(SYSUSERSDIR)/beamd.conf; fi
	@echo "beamd installed under $(DESTDIR)$(PREFIX); then: systemctl daemon-reload && systemctl enable --now beamd"

# Removes what install put, except /etc/beamd/beamd.yaml (the operator's,
# perhaps edited) and data; a beamd.yaml.new still equal to the minimal
# config goes. The service user stays (files may still belong to it).
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/beamd $(TOOLS:%=$(DESTDIR)$(BINDIR)/%) $(SCRIPTS:%=$(DESTDIR)$(BINDIR)/%)
	rm -f $(DESTDIR)$(UNITDIR)/beamd.service $(DESTDIR)$(SYSUSERSDIR)/beamd.conf
	rm -f $(DESTDIR)$(DOCDIR)/beamd.yaml.example $(DESTDIR)$(DOCDIR)/README.md \
	  $(DOC_FILES:%=$(DESTDIR)$(DOCDIR)/docs/%) $(VIEW_FILES:%=$(DESTDIR)$(VIEWDIR)/%)
	rm -f $(MAN_FILES:%=$(DESTDIR)$(MANDIR)/%)
	@# Directories only when empty: on a real system share/man holds others' pages.
	-rmdir $(DESTDIR)$(DOCDIR)/docs $(DESTDIR)$(DOCDIR) $(DESTDIR)$(VIEWDIR) \
	  $(DESTDIR)$(PREFIX)/share/beamd-view $(DESTDIR)$(MANDIR) $(DESTDIR)$(PREFIX)/share/man 2>/dev/null
	@c=$(DESTDIR)/etc/beamd/beamd.yaml; \
	if [ -e $$c.new ] && cmp -s etc/beamd-minimal.yaml $$c.new; then rm -f $$c.new; fi; \
	if [ -e $$c ]; then echo "kept $$c (your configuration)"; fi

print-config:
	@echo "CC=$(CC)"; echo "CUDA=$(CUDA) NVCC=$(or $(NVCC),none) CUDA_ARCH=$(CUDA_ARCH)"
	@echo "SANITIZER=$(or $(SANITIZER),none) BUILD=$(BUILD) PYTHON=$(PYTHON)"
	@echo "TOOLS=$(TOOLS)"

clean:
	rm -rf $(BUILD)

-include $(ALL_OBJ:.o=.d)
