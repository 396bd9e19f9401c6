"""Offline replay of real routing traces through the engine's own expert cache and policies."""
