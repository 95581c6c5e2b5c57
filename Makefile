# `sam build --build-in-source` runs this (template.yaml's functions use the makefile
# build method), once per function: each target first runs one cargo invocation for every
# function's bootstrap (the first builds them all, the dependencies compiled once with
# their features unified and the release links in parallel; the later ones find nothing
# to do), then copies its own. Without --build-in-source SAM would first copy the whole
# source tree, target/ included.
#
# LAMBDA_ARCH (required): arm64 or x86-64, as the template's Architecture parameter says
# (SAM does not pass it here; ./scripts/build-artifacts sets both).
ifeq ($(filter arm64 x86-64,$(LAMBDA_ARCH)),)
$(error set LAMBDA_ARCH to arm64 or x86-64, as the Architecture parameter: LAMBDA_ARCH=arm64 sam build --build-in-source)
endif
FUNCTIONS := api control-worker shipping billing
# Where cargo builds: target/, or CARGO_TARGET_DIR (the test command gives this build a
# directory of its own, so that it never waits on the lock of the tests' builds).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

.PHONY: bootstraps build-ApiFunction build-ControlWorkerFunction build-ShippingFunction build-BillingFunction

bootstraps:
	cargo lambda build --release --$(LAMBDA_ARCH) --locked $(addprefix --bin ,$(FUNCTIONS))

build-ApiFunction: bootstraps
	cp $(TARGET_DIR)/lambda/api/bootstrap "$(ARTIFACTS_DIR)/bootstrap"

build-ControlWorkerFunction: bootstraps
	cp $(TARGET_DIR)/lambda/control-worker/bootstrap "$(ARTIFACTS_DIR)/bootstrap"

build-ShippingFunction: bootstraps
	cp $(TARGET_DIR)/lambda/shipping/bootstrap "$(ARTIFACTS_DIR)/bootstrap"

build-BillingFunction: bootstraps
	cp $(TARGET_DIR)/lambda/billing/bootstrap "$(ARTIFACTS_DIR)/bootstrap"
