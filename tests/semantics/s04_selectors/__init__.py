"""Spec §4 JMS selectors: grammar, evaluation, LIKE and REGEX, their bounds."""
