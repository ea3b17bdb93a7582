"""Pagoda's Django project: registry, keys, usage, the OpenAI API, chat, console, monitoring."""
