# The ONNX tests run the built program (model show, import, train).
if(TARGET test_onnx)
  add_dependencies(test_onnx meshtrain)
endif()

# From PyTorch and back (tests/onnx/round_trip.py): Debian's python3-torch exports a network,
# meshtrain trains it at four layouts, PyTorch loads the state dict back and replays the
# training. Skipped (exit 77) where PyTorch is not installed (scripts/setup.sh --tests installs it).
find_program(MESHTRAIN_SYSTEM_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(MESHTRAIN_SYSTEM_PYTHON)
  add_test(NAME onnx_round_trip
           COMMAND ${MESHTRAIN_SYSTEM_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/round_trip.py $<TARGET_FILE:meshtrain>
                   /usr/share/datasets/fashion-mnist ${CMAKE_BINARY_DIR}/test_work)
  set_tests_properties(onnx_round_trip PROPERTIES TIMEOUT 900 LABELS onnx SKIP_RETURN_CODE 77)
endif()
