"""The file MLflow runs to load a logged point model ("models from code").

Logging copies this file into the model and MLflow runs it on load, instead of unpickling a
model object: it names the class to build by import, so the model holds no executable payload
and keeps loading when pickle or the class's module changes. `PointModel.load_context` then
reads the point's artifacts (weights as safetensors or ONNX, the input pipeline, `point.json`).
"""

import mlflow

from tuner.deploy.serving import PointModel

mlflow.models.set_model(PointModel())
