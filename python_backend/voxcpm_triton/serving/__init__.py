"""The logic behind each Triton model; model_repository/*/1/model.py only forwards to these classes."""
