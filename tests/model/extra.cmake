# The named models from their files give the curves of the code they replaced (bit for bit on
# the recording CPU's instruction sets): tests/model/check_named_curves.py, one test a family
# (the image models against tests/model/named_curves.json, the token models against
# named_token_curves.json).
add_test(NAME named_models_curves_unchanged
         COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/model/check_named_curves.py $<TARGET_FILE:meshtrain>
                 ${CMAKE_SOURCE_DIR}/tests/model image)
set_tests_properties(named_models_curves_unchanged PROPERTIES TIMEOUT 900 LABELS model)
add_test(NAME named_token_models_curves_unchanged
         COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/model/check_named_curves.py $<TARGET_FILE:meshtrain>
                 ${CMAKE_SOURCE_DIR}/tests/model token)
set_tests_properties(named_token_models_curves_unchanged PROPERTIES TIMEOUT 900 LABELS model)
