"""engines/classic"""
