"""Serving trained policies: the OpenAI-compatible server and, later, routing, feedback and promotion."""
