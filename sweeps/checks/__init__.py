"""Checks before anything is written (values, paths, servers, resources, cluster): no writes, no ray.init."""
