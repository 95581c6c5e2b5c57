# `sam build --build-in-source` runs this (template.yaml's functions use the makefile
# build method): the first target it asks for builds every function's bootstrap in one
# cargo invocation, so the dependencies compile once for all three (with their features
# unified) and the release links run in parallel; every target then copies its own.
# Without --build-in-source SAM would first copy the whole source tree, target/ included.
#
# LAMBDA_ARCH: arm64 (the template's default Architecture) or x86-64; keep it equal to
# the Architecture parameter (./scripts/build-artifacts does).
LAMBDA_ARCH ?= arm64
FUNCTIONS := api control-worker shipping

.PHONY: bootstraps build-ApiFunction build-ControlWorkerFunction build-ShippingFunction

bootstraps:
	cargo lambda build --release --$(LAMBDA_ARCH) --locked $(addprefix --bin ,$(FUNCTIONS))

build-ApiFunction: bootstraps
	cp target/lambda/api/bootstrap "$(ARTIFACTS_DIR)/bootstrap"

build-ControlWorkerFunction: bootstraps
	cp target/lambda/control-worker/bootstrap "$(ARTIFACTS_DIR)/bootstrap"

build-ShippingFunction: bootstraps
	cp target/lambda/shipping/bootstrap "$(ARTIFACTS_DIR)/bootstrap"
