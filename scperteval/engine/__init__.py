"""The protocol engine.

Spaces, sources, views, protocol descriptors, suites, dispatch and calibrators.
"""
