# The named models from their files give the curves of the code they replaced (bit for bit on
# the recording CPU's instruction sets): tests/model/check_named_curves.py.
add_test(NAME named_models_curves_unchanged
         COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/model/check_named_curves.py $<TARGET_FILE:meshtrain>
                 ${CMAKE_SOURCE_DIR}/tests/model)
set_tests_properties(named_models_curves_unchanged PROPERTIES TIMEOUT 900 LABELS model)
