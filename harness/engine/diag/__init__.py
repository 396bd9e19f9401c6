"""Measurement tools that nothing in the engine imports: batch exactness of verify batches, the cache-management
profile of the live engine.

May import: anything in the engine.
"""
