"""Helpers shared by the entry points: complexity counting and checkpoint I/O."""
