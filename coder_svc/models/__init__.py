"""Model backends: chat models (``openai``, ``hf``) behind one interface; see ``base``."""
