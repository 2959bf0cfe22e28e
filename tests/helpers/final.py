from stage2_data.stages import KIT, STORE

FINAL_STAGE = [*KIT.assets, *STORE.assets]  # the kit and store stages in one run executed in process
