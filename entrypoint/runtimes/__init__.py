"""The optional runtimes the image leaves out (pyarrow for parquet datasets; onnx and onnxruntime for EXPORT=onnx),
fetched on first use into the volume with the image's pip (``fetch``)."""
