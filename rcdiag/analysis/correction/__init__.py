"""Corrections and gates: IS modes (TIS/MIS, token or sequence), verl's rejection options, the gate families and each framework's logged numbers of them."""
