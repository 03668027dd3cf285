"""Evaluation of exported (Hugging Face) models: the held-out set's scores (`kaiyuan eval heldout`)."""
