"""Models: the zoo (:mod:`~parplan.models.zoo`), transformer configurations
(:mod:`~parplan.models.transformers`), model files and layer tables
(:mod:`~parplan.models.modelfile`), and importers of PyTorch, ONNX and library models
(:mod:`~parplan.models.importers`; docs/importers.md). All build layer graphs
(:mod:`parplan.costmodel.graph`)."""
