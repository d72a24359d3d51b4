"""The file MLflow runs to load a logged PyTorch point model ("models from code"); points that a
runtime serves without PyTorch are logged with `tuner/serving/point_loader.py`.

Logging copies this file into the model and MLflow runs it on load, instead of unpickling a
model object: it names the class to build by import, so the model holds no executable payload
and keeps loading when pickle or the class's module changes. `load_context` then reads the
point's artifacts (weights as safetensors, the input pipeline, `point.json`).
"""

import mlflow

from tuner.deploy.serving import TorchPointModel

mlflow.models.set_model(TorchPointModel())
