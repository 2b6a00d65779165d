"""avatar"""
