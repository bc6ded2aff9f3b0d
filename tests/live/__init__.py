"""The live tests. A package, so that their shared stack (the package-scoped ``live``
fixture, whose demo engines keep most of a core busy) stops after the last of them."""
