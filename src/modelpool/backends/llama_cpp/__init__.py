"""llama.cpp through llama-cpp-python: GGUF chat and completion models."""
