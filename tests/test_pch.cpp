// The anchor of the tests' precompiled header (tests/test_pch.h): a translation unit with nothing else.
