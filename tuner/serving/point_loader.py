"""The file MLflow runs to load a logged point model served without PyTorch ("models from
code"): an ONNX Runtime or OpenVINO point. It imports only `tuner.serving`, so the environment
that serves the model needs only what the model's requirements list.

Logging copies this file into the model and MLflow runs it on load, instead of unpickling a
model object: the model holds no executable payload.
"""

import mlflow

from tuner.serving import PointModel

mlflow.models.set_model(PointModel())
