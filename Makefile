.PHONY: install test test-full lint smoke

install:
	pip install -e '.[test]'

test:
	python -m pytest

test-full:
	python -m pytest -m "slow or not slow"

lint:
	ruff check tuner tests scripts
	ruff format --check tuner tests scripts

smoke:
	python -m tuner +experiment=bert_ffn debug=smoke
