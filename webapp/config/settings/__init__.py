"""Settings split by deployment: base (shared), local (development), test, production.

Pick one with DJANGO_SETTINGS_MODULE, e.g. ``webapp.config.settings.production``.
"""
