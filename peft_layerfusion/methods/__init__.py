"""The encoder fusion methods, one file each: its formula, config, fusion module and PEFT tuner.

``dwatt`` (depth-wise attention), ``concat`` (a linear map of all layers), and the baselines
``average``, ``scalar_mix`` and ``extra_layers`` (R+n). The list that registers them is
``peft_layerfusion.registration.METHODS``.
"""
