"""A local stand-in for the Hugging Face Hub, for tests (see server.py)."""
