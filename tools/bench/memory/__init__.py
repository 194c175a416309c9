"""Benches of a real daemon's memory: does it stay flat over many requests, over hostile values,
with many voices?"""
