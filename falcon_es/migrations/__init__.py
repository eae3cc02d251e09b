"""Alembic migrations for the Falcon-ES database (MySQL/MariaDB and SQLite).

Shipped inside the wheel so that ``pip install .`` then ``falcon-es db upgrade`` works.
"""
