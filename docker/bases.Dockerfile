# The PyTorch runtime images the published variants build on, one stage per CUDA build. Never built: it is here
# so Dependabot sees the bases (it reads FROM lines, not the ARG default of ../Dockerfile). The image workflow
# reads each variant's base from this file; a unit test keeps ../Dockerfile's default equal to the cu126 one.
FROM pytorch/pytorch:2.14.1-cuda12.6-cudnn9-runtime AS cu126
FROM pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime AS cu130
