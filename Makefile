# amptool — two commands on a fresh machine:
#   make demo   converts the shipped example model to float16 and prints the accuracy report
#   make test   runs the test suite
# Both create .venv and install what they need on first use.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: demo test test-all zoo lint clean venv check-models

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
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

lint: $(STAMP)
	$(PY) -m pip install --quiet -e '.[lint]'
	$(VENV)/bin/ruff check amptool tests benchmarks configs
	$(VENV)/bin/mypy amptool

clean:
	rm -rf out .pytest_cache
