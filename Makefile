# amptool — two commands on a fresh machine:
#   make demo   converts the shipped example model to float16 and prints the accuracy report
#   make test   runs the test suite
# Both create .venv and install what they need on first use.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: demo test test-all zoo lint clean venv check-models check-models-remote conformance detection

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@# An editable install compiles no bytecode, and with PYTHONDONTWRITEBYTECODE set every run
	@# compiled amptool's ~100 modules again (~0.2 s of each command, measured).
	$(PY) -m compileall -q amptool
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/amptool convert examples/tiny_cnn.onnx --dtype float16 -o out/tiny_cnn-fp16
	$(VENV)/bin/amptool diff examples/tiny_cnn.onnx --dtype float16 --json out/tiny_cnn-fp16-diff.json

# The default suite: everything except tests marked slow. Runs on 2 cores in a few minutes.
test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) -m "not slow and not zoo"

# Everything, including the heavy end-to-end checks (all light_* models of the onnx wheel).
test-all: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) -m "not zoo"

# Real PyTorch exports (ResNet, MobileNet, BERT, GPT-2, ViT, LSTM, CRNN-OCR; TorchScript and
# dynamo exporters) through convert + diff. Installs torch 2.13 CPU + transformers (~1 GB).
zoo: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,zoo]'
	$(PY) -m pytest -q -n $(JOBS) -m zoo

# convert + diff over configs/models.yaml (models × dtypes × targets); fails on a FAILED verdict.
check-models: $(STAMP)
	$(PY) configs/check_models.py

# The same matrix with every diff run on a device of a TVM RPC tracker, spread over its free devices
# under KEY (docs/remote.md): make check-models-remote RPC=10.0.0.2:9190 KEY=rasp4
check-models-remote: $(STAMP)
	$(PY) configs/check_models.py --rpc $(RPC) --rpc-key $(KEY) --out out/check-models-remote

# Every ONNX backend node case (regenerated from the installed onnx, nothing downloaded) through
# onnxruntime and amptool float32/float16/bfloat16; per-op table in docs/conformance.md. ~6-15 min on 2 cores.
# A subset: make conformance ARGS="--ops Add,Conv" (or --filter REGEX).
conformance: $(STAMP)
	$(PY) -m conformance.run --jobs $(JOBS) $(ARGS)

# torchvision's SSDlite and Faster R-CNN (random seeded weights, exported here) through diff float32 and
# convert float16. A venv of its own: PyPI's torchvision needs torch 2.14.1, the zoo pins 2.13 (~5.5 GB).
detection:
	test -x .venv-vision/bin/python || $(PYTHON) -m venv .venv-vision
	.venv-vision/bin/python -m pip install --quiet -e '.[vision]'
	.venv-vision/bin/python -m pytest -q -m detection tests/test_detection.py

lint: $(STAMP)
	$(PY) -m pip install --quiet -e '.[lint]'
	$(VENV)/bin/ruff check amptool tests benchmarks configs conformance
	$(VENV)/bin/mypy amptool

clean:
	rm -rf out .pytest_cache
