"""The workload: models as ordered layers with FLOPs, bytes, parameters and activations per sample."""

from topotrain.workload.cnn import alexnet, inception_v3, resnet50, resnet101, vgg16
from topotrain.workload.layer import Layer, LayerKind, Model, TPSplit
from topotrain.workload.transformer import transformer
from topotrain.workload.zoo import MEGATRON_SC21_TABLE1, MODELS, MegatronRun, get_model, model_from_dict

__all__ = [
    "MEGATRON_SC21_TABLE1",
    "MODELS",
    "Layer",
    "LayerKind",
    "MegatronRun",
    "Model",
    "TPSplit",
    "alexnet",
    "get_model",
    "inception_v3",
    "model_from_dict",
    "resnet50",
    "resnet101",
    "transformer",
    "vgg16",
]
